"""Gradient accumulation must not change the update (DESIGN.md §3, Aggregation).

With the tiny real model: the gradient of the whole-batch loss (written here straight from the
formula) equals the sum of the gradients of the per-micro-batch shares from `aggregate_loss`
with the step's shared `LossNormalizer` totals, as `Trainer._update` accumulates them.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.core.logprobs import completion_logprobs
from grpo_cli.core.loss import (
    LossNormalizer,
    aggregate_loss,
    clipped_surrogate,
    importance_ratio,
    kl_penalty,
)

B, P, C = 8, 5, 7
MAX_NEW = 10  # > C, so dr_grpo's constant differs from the padded width
EPS_LOW, EPS_HIGH, BETA = 0.2, 0.28, 0.04


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    m.eval()  # no dropout: the two computations must see the same function
    return m


def _batch(lengths, scorable):
    """A fake rollout: random ids, left-padded prompts, completions masked after `lengths`."""
    gen = torch.Generator().manual_seed(1234)
    vocab = 200
    prompt_ids = torch.randint(0, vocab, (B, P), generator=gen)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding on a couple of rows
    prompt_mask[6, :1] = 0
    completion_ids = torch.randint(0, vocab, (B, C), generator=gen)
    completion_mask = (torch.arange(C).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    loss_mask = completion_mask.float() * torch.tensor(scorable, dtype=torch.float32).unsqueeze(1)
    advantages = torch.randn(B, generator=gen) * torch.tensor(scorable, dtype=torch.float32)
    # Behaviour and reference log-prob offsets, so ratios move off 1 and some tokens clip.
    old_shift = 0.3 * torch.randn(B, C, generator=gen)
    ref_shift = 0.5 * torch.randn(B, C, generator=gen)
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        loss_mask=loss_mask,
        advantages=advantages,
        old_shift=old_shift,
        ref_shift=ref_shift,
    )


# Ragged lengths, one unscorable row (all of its tokens leave the loss).
RAGGED = _batch(lengths=[7, 3, 5, 1, 6, 7, 2, 4], scorable=[1, 1, 1, 1, 0, 1, 1, 1])
# Every half and every quarter (consecutive pairs) holds exactly 10 tokens per pair.
BALANCED = _batch(lengths=[7, 3, 4, 6, 5, 5, 6, 4], scorable=[1] * 8)


@pytest.fixture(scope="module")
def fixed_logps(model):
    """old = lp + noise and ref = lp + noise, computed once for the whole batch (no grad)."""
    out = {}
    for name, b in (("ragged", RAGGED), ("balanced", BALANCED)):
        with torch.no_grad():
            lp = completion_logprobs(
                model, b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"]
            )
        assert torch.isfinite(lp).all()
        out[name] = (lp + b["old_shift"], lp + b["ref_shift"])
    return out


def _per_token(model, b, rows, old, ref, ratio_level):
    logps = completion_logprobs(
        model,
        b["prompt_ids"][rows],
        b["prompt_mask"][rows],
        b["completion_ids"][rows],
        b["completion_mask"][rows],
    )
    mask = b["loss_mask"][rows]
    ratio = importance_ratio(logps, old[rows], mask, ratio_level)
    loss, _, _ = clipped_surrogate(ratio, b["advantages"][rows], EPS_LOW, EPS_HIGH)
    return loss + BETA * kl_penalty(logps, ref[rows], "k3"), mask


def _whole_batch_loss(per_token, mask, loss_type):
    """DESIGN.md §3 formulas, written out directly over the whole batch."""
    token_counts = mask.sum(-1)
    in_loss = token_counts > 0  # unscorable rows are in no denominator
    masked_sum = (per_token * mask).sum(-1)
    if loss_type == "grpo":
        return (masked_sum[in_loss] / token_counts[in_loss]).mean()
    if loss_type == "dr_grpo":
        return masked_sum.sum() / (in_loss.sum() * MAX_NEW)
    # dapo; and bnpo with a single micro-batch
    return masked_sum.sum() / token_counts.sum()


def _grad(model):
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return g


def _whole_and_accumulated(model, fixed_logps, batch_name, loss_type, micro_batches, ratio_level):
    b = RAGGED if batch_name == "ragged" else BALANCED
    old, ref = fixed_logps[batch_name]
    all_rows = torch.arange(B)
    model.zero_grad(set_to_none=True)

    per_token, mask = _per_token(model, b, all_rows, old, ref, ratio_level)
    whole_loss = _whole_batch_loss(per_token, mask, loss_type)
    whole_loss.backward()
    whole_grad = _grad(model)

    norm = LossNormalizer(
        loss_type=loss_type,
        sequences=int((b["loss_mask"].sum(-1) > 0).sum()),
        tokens=int(b["loss_mask"].sum()),
        max_new_tokens=MAX_NEW,
        micro_batches=micro_batches,
    )
    chunks = all_rows.chunk(micro_batches)
    assert len(chunks) == micro_batches
    acc_loss = 0.0
    for rows in chunks:
        per_token, mask = _per_token(model, b, rows, old, ref, ratio_level)
        share = aggregate_loss(per_token, mask, norm)
        share.backward()
        acc_loss += share.item()
    acc_grad = _grad(model)
    return whole_loss.item(), whole_grad, acc_loss, acc_grad


def _assert_same_grad(acc, whole):
    assert whole.norm() > 0
    rel = ((acc - whole).norm() / whole.norm()).item()
    assert rel < 1e-5, f"relative gradient difference {rel:.2e}"
    assert torch.allclose(acc, whole, rtol=1e-4, atol=1e-5 * whole.abs().max().item())


# Token-level ratio on both batches; the GSPO sequence-level ratio on the ragged one.
CASES = [("token", "ragged"), ("token", "balanced"), ("sequence", "ragged")]


@pytest.mark.parametrize("micro_batches", [2, 4])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(("ratio_level", "batch_name"), CASES)
def test_accumulated_gradient_equals_whole_batch(
    model, fixed_logps, batch_name, loss_type, micro_batches, ratio_level
):
    """Splitting a step into 2 or 4 micro-batches gives the same loss and gradient."""
    whole_loss, whole_grad, acc_loss, acc_grad = _whole_and_accumulated(
        model, fixed_logps, batch_name, loss_type, micro_batches, ratio_level
    )
    assert acc_loss == pytest.approx(whole_loss, rel=1e-5)
    _assert_same_grad(acc_grad, whole_grad)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_bnpo_equals_whole_batch_when_micro_batches_hold_equal_tokens(model, fixed_logps, micro_batches):
    """bnpo averages per-micro-batch token means: equal to the batch token mean when counts match."""
    whole_loss, whole_grad, acc_loss, acc_grad = _whole_and_accumulated(
        model, fixed_logps, "balanced", "bnpo", micro_batches, "token"
    )
    assert acc_loss == pytest.approx(whole_loss, rel=1e-5)
    _assert_same_grad(acc_grad, whole_grad)


def test_bnpo_with_unequal_micro_batches_is_the_mean_of_micro_batch_means(model, fixed_logps):
    """Documented bnpo behaviour on ragged batches: mean over micro-batches of sum m*l / sum m."""
    b = RAGGED
    old, ref = fixed_logps["ragged"]
    model.zero_grad(set_to_none=True)
    halves = torch.arange(B).chunk(2)
    means = []
    for rows in halves:
        per_token, mask = _per_token(model, b, rows, old, ref, "token")
        means.append((per_token * mask).sum() / mask.sum())
    expected = (means[0] + means[1]) / 2
    expected.backward()
    expected_grad = _grad(model)

    norm = LossNormalizer(
        "bnpo", sequences=7, tokens=int(b["loss_mask"].sum()), max_new_tokens=MAX_NEW, micro_batches=2
    )
    acc_loss = 0.0
    for rows in halves:
        per_token, mask = _per_token(model, b, rows, old, ref, "token")
        share = aggregate_loss(per_token, mask, norm)
        share.backward()
        acc_loss += share.item()
    assert acc_loss == pytest.approx(expected.item(), rel=1e-5)
    _assert_same_grad(_grad(model), expected_grad)
