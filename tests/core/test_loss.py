"""The per-token GRPO objective and its aggregation, checked against docs/architecture.md §3 by hand."""

import math

import pytest
import torch

from grpo_cli.core.loss import (
    LossNormalizer,
    aggregate_loss,
    clipped_surrogate,
    dual_clip,
    importance_ratio,
    kl_penalty,
)

# A hand-built per-token loss and mask (B = 3 sequences, T = 4 tokens), plus a 4th row that is
# fully masked (an unscorable completion: in no denominator).
#   row 0: 1 + 2 + 3        = 6   over 3 tokens -> 2.0
#   row 1: 5 + 6            = 11  over 2 tokens -> 5.5
#   row 2: 0.5 + 1.5 - 1 + 2 = 3  over 4 tokens -> 0.75
#   total 20 over 9 tokens.
LOSS = torch.tensor(
    [
        [1.0, 2.0, 3.0, 4.0],
        [5.0, 6.0, 7.0, 8.0],
        [0.5, 1.5, -1.0, 2.0],
        [100.0, 100.0, 100.0, 100.0],
    ]
)
MASK = torch.tensor(
    [
        [1.0, 1.0, 1.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
)
SEQUENCES, TOKENS, MAX_NEW = 3, 9, 8

# Whole-batch values straight from the formulas.
WHOLE = {
    "grpo": (2.0 + 5.5 + 0.75) / 3,  # mean over sequences of per-sequence means = 2.75
    "bnpo": 20 / 9,  # sum m*l / sum m
    "dr_grpo": 20 / (3 * 8),  # sum m*l / (B * max_new_tokens)
    "dapo": 20 / 9,  # sum m*l / tokens in the whole batch
    "luspo": 20 / 3,  # sum m*l / B: each sequence's token sum, averaged over sequences
}


def _norm(loss_type, micro_batches=1):
    return LossNormalizer(
        loss_type=loss_type,
        sequences=SEQUENCES,
        tokens=TOKENS,
        max_new_tokens=MAX_NEW,
        micro_batches=micro_batches,
    )


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
def test_aggregate_whole_batch_matches_formula(loss_type):
    """One micro-batch: each loss_type gives its documented normalisation; masked tokens ignored."""
    got = aggregate_loss(LOSS, MASK, _norm(loss_type)).item()
    assert got == pytest.approx(WHOLE[loss_type], rel=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize("splits", [[1, 3], [2, 2], [1, 1, 1, 1], [3, 1]])
def test_micro_batch_shares_sum_to_whole_batch(loss_type, splits):
    """Gradient accumulation does not change the loss: the per-micro-batch shares sum to it."""
    norm = _norm(loss_type, micro_batches=len(splits))
    shares = [aggregate_loss(lo, m, norm).item() for lo, m in zip(LOSS.split(splits), MASK.split(splits), strict=True)]
    assert sum(shares) == pytest.approx(WHOLE[loss_type], rel=1e-6)


def test_bnpo_averages_micro_batch_means():
    """bnpo normalises per micro-batch, then averages the micro-batches (documented)."""
    norm = _norm("bnpo", micro_batches=2)
    # micro-batch A = row 0: 6 / 3 = 2.0;  micro-batch B = rows 1..3: (11 + 3) / (2 + 4) = 14/6
    expected = (2.0 + 14 / 6) / 2
    pairs = zip(LOSS.split([1, 3]), MASK.split([1, 3]), strict=True)
    shares = [aggregate_loss(lo, m, norm).item() for lo, m in pairs]
    assert sum(shares) == pytest.approx(expected, rel=1e-6)
    # ... which differs from the whole-batch token mean when token counts differ,
    assert expected != pytest.approx(20 / 9)
    # ... and equals it when the micro-batches hold equal token counts (3 and 3 here).
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0] * 4, [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # half 1: 1+2+3 = 6 over 3; half 2: 0.5+1.5+100 = 102 over 3; whole: 108 / 6 = 18
    shares = [aggregate_loss(lo, m, norm).item() for lo, m in zip(LOSS.split(2), mask.split(2), strict=True)]
    assert sum(shares) == pytest.approx(108 / 6, rel=1e-6)


def test_grpo_empty_sequence_does_not_dilute_the_mean():
    """A fully masked (unscorable) row adds nothing when the normaliser counts only real rows."""
    got = aggregate_loss(LOSS[3:], MASK[3:], _norm("grpo")).item()
    assert got == 0.0
    assert math.isfinite(got)


def test_aggregate_unknown_loss_type_is_an_error():
    with pytest.raises(ValueError):
        aggregate_loss(LOSS, MASK, _norm("nope"))


# ---- KL estimators ----------------------------------------------------------------------

LP = [-0.5, -2.0, -1.0, -0.01, -3.0]
REF = [-0.7, -1.0, -1.0, -4.0, -0.2]


def test_kl_k1():
    """k1 = lp - ref."""
    got = kl_penalty(torch.tensor(LP), torch.tensor(REF), "k1").tolist()
    assert got == pytest.approx([lp - ref for lp, ref in zip(LP, REF, strict=True)], rel=1e-6, abs=1e-7)


def test_kl_k2():
    """k2 = 1/2 (lp - ref)^2."""
    got = kl_penalty(torch.tensor(LP), torch.tensor(REF), "k2").tolist()
    expected = [0.5 * (lp - ref) ** 2 for lp, ref in zip(LP, REF, strict=True)]
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_kl_k3_formula_nonnegative_and_zero_when_equal():
    """k3 = exp(ref - lp) - (ref - lp) - 1: the default, never negative, 0 at pi = pi_ref."""
    got = kl_penalty(torch.tensor(LP), torch.tensor(REF), "k3").tolist()
    expected = [math.exp(ref - lp) - (ref - lp) - 1 for lp, ref in zip(LP, REF, strict=True)]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert kl_penalty(torch.tensor(LP), torch.tensor(REF)).tolist() == got  # k3 is the default

    grid = torch.linspace(-6, 0, 25)
    lp, ref = torch.meshgrid(grid, grid, indexing="ij")
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert kl_penalty(grid, grid, "k3").tolist() == [0.0] * 25


def test_kl_unknown_estimator_is_an_error():
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")


# ---- clipping ---------------------------------------------------------------------------


def _surrogate_and_grad(ratios, adv, eps_low, eps_high):
    ratio = torch.tensor([ratios], requires_grad=True)
    loss, low, high = clipped_surrogate(ratio, torch.tensor([adv]), eps_low, eps_high)
    loss.sum().backward()
    return loss[0].tolist(), ratio.grad[0].tolist(), low[0].tolist(), high[0].tolist()


def test_positive_advantage_is_clipped_above_one_plus_eps_high():
    """A > 0: the objective grows with the ratio up to 1+eps, then stops (zero gradient)."""
    ratios = [0.5, 1.0, 1.1, 1.3, 2.0]
    loss, grad, low, high = _surrogate_and_grad(ratios, 2.0, 0.2, 0.2)
    # -min(r*A, clip(r, 0.8, 1.2)*A) with A = 2
    expected = [-min(r * 2.0, min(max(r, 0.8), 1.2) * 2.0) for r in ratios]
    assert expected == pytest.approx([-1.0, -2.0, -2.2, -2.4, -2.4])
    assert loss == pytest.approx(expected, rel=1e-6)
    assert grad == pytest.approx([-2.0, -2.0, -2.0, 0.0, 0.0])
    assert high == [False, False, False, True, True]
    assert low == [False] * 5  # a low ratio with A > 0 is not clipped (min keeps it)


def test_negative_advantage_is_clipped_below_one_minus_eps_low():
    """A < 0: pushing the ratio down stops paying off below 1-eps (zero gradient there)."""
    ratios = [0.5, 0.7, 0.9, 1.0, 1.5]
    loss, grad, low, high = _surrogate_and_grad(ratios, -1.0, 0.2, 0.2)
    expected = [-min(r * -1.0, min(max(r, 0.8), 1.2) * -1.0) for r in ratios]
    assert expected == pytest.approx([0.8, 0.8, 0.9, 1.0, 1.5])
    assert loss == pytest.approx(expected, rel=1e-6)
    assert grad == pytest.approx([0.0, 0.0, 1.0, 1.0, 1.0])
    assert low == [True, True, False, False, False]
    assert high == [False] * 5  # a high ratio with A < 0 is not clipped


def test_asymmetric_clip_higher():
    """eps_low and eps_high are separate (DAPO clip-higher: 0.1 below, 0.28 above)."""
    ratios = [0.85, 0.95, 1.25, 1.3]
    # A > 0: upper bound 1.28 -> 1.25 is free, 1.3 is clipped.
    loss, grad, low, high = _surrogate_and_grad(ratios, 1.0, 0.1, 0.28)
    assert loss == pytest.approx([-0.85, -0.95, -1.25, -1.28], rel=1e-6)
    assert grad == pytest.approx([-1.0, -1.0, -1.0, 0.0])
    assert high == [False, False, False, True]
    # A < 0: lower bound 0.9 -> 0.85 is clipped, 0.95 is free.
    loss, grad, low, high = _surrogate_and_grad(ratios, -1.0, 0.1, 0.28)
    assert loss == pytest.approx([0.9, 0.95, 1.25, 1.3], rel=1e-6)
    assert grad == pytest.approx([0.0, 1.0, 1.0, 1.0])
    assert low == [True, False, False, False]


def test_surrogate_gradient_at_ratio_one_is_minus_advantage():
    """On-policy (old = stop_gradient(lp)): d loss_t / d logp_t = -A, the REINFORCE signal."""
    torch.manual_seed(0)
    logp = (-torch.rand(3, 5) * 3).requires_grad_()
    adv = torch.tensor([0.7, -1.3, 0.0])
    mask = torch.ones(3, 5)
    ratio = importance_ratio(logp, logp.detach(), mask, "token")
    assert torch.equal(ratio.detach(), torch.ones(3, 5))
    loss, low, high = clipped_surrogate(ratio, adv, 0.2, 0.2)
    loss.sum().backward()
    for row, a in zip(logp.grad.tolist(), (0.7, -1.3, 0.0), strict=True):
        assert row == pytest.approx([-a] * 5, rel=1e-6, abs=1e-7)
    assert not low.any() and not high.any()


def test_sequence_level_gradient_at_ratio_one_is_spread_over_valid_tokens():
    """GSPO at ratio 1: d loss / d logp_t = -A * m_t / |y| (length-normalised log-ratio)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -0.4, -0.6, -0.8]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([2.0, -1.0])
    ratio = importance_ratio(logp, logp.detach(), mask, "sequence")
    loss, _, _ = clipped_surrogate(ratio, adv, 0.2, 0.2)
    loss.sum().backward()
    # row 0: each of the 4 tokens' losses depends on the 2 valid log-probs with weight 1/2:
    # d/d lp_t sum_s loss_s = 4 * (-A) * m_t / 2
    assert logp.grad.tolist()[0] == pytest.approx([-4.0, -4.0, 0.0, 0.0])
    assert logp.grad.tolist()[1] == pytest.approx([1.0, 1.0, 1.0, 1.0])


# ---- importance ratio -------------------------------------------------------------------


def test_token_ratio_is_exp_of_log_ratio():
    lp = torch.tensor([[-1.0, -0.5, -2.0]])
    old = torch.tensor([[-1.2, -0.5, -1.0]])
    got = importance_ratio(lp, old, torch.ones(1, 3), "token")[0].tolist()
    assert got == pytest.approx([math.exp(0.2), 1.0, math.exp(-1.0)], rel=1e-6)


def test_sequence_ratio_is_exp_of_masked_mean_broadcast():
    """GSPO: one ratio per sequence, exp(mean over valid tokens of lp - old), on every token."""
    old = torch.zeros(2, 4)
    # row 0 log-ratios 0.1, -0.3, 0.5 valid, then 9.0 masked: mean = 0.3 / 3 = 0.1
    # row 1 log-ratio -0.2 is the only valid one: mean = -0.2 (the masked 50s are ignored)
    lp = torch.tensor([[0.1, -0.3, 0.5, 9.0], [-0.2, 50.0, 50.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    got = importance_ratio(lp, old, mask, "sequence")
    assert got.shape == (2, 4)
    assert got[0].tolist() == pytest.approx([math.exp(0.1)] * 4, rel=1e-6)
    assert got[1].tolist() == pytest.approx([math.exp(-0.2)] * 4, rel=1e-6)


def test_sequence_ratio_of_empty_sequence_is_finite():
    """A fully masked row (unscorable) must not produce NaN from 0/0."""
    got = importance_ratio(torch.ones(1, 3), torch.zeros(1, 3), torch.zeros(1, 3), "sequence")
    assert torch.isfinite(got).all()


def test_unknown_ratio_level_is_an_error():
    with pytest.raises(ValueError):
        importance_ratio(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "word")


def test_dual_clip_caps_only_a_negative_advantage_past_its_cap():
    """c = 3, one token per row. A = -1 with loss 5: capped at 3, no gradient. A = -1 with loss
    exactly 3: the cap changes nothing, so it is not counted as capped and its gradient flows (the
    clip's indicators count only tokens whose objective changed). A = 0 and A = 1: never capped,
    whatever the loss (the cap -c·A is for negative advantages only)."""
    loss = torch.tensor([[5.0], [3.0], [0.5], [5.0]], requires_grad=True)
    out, capped = dual_clip(loss, torch.tensor([-1.0, -1.0, 0.0, 1.0]), 3.0)
    out.sum().backward()
    assert out.detach().flatten().tolist() == [3.0, 3.0, 0.5, 5.0]
    assert capped.flatten().tolist() == [True, False, False, False]
    assert loss.grad.flatten().tolist() == [0.0, 1.0, 1.0, 1.0]
