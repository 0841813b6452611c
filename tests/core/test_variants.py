"""The optional terms of the objective (issue 23), each with worked numbers on `token_loss`, the
function micro_step calls, and through `policy_update` on the real tiny model: dual-clip, the KL
ratio correction, high-entropy token selection, the rollout correction and the entropy bonus.
A changed formula changes a number here."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, RolloutCorrectionConfig
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.core.objective import token_loss
from tests.core.conftest import advantages_for, flat
from tests.core.test_update import run_update

EPS = (0.2, 0.2)


def leaf(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def loss_and_grad(logps: torch.Tensor, **kwargs) -> tuple[list[float], list[float]]:
    """Per-token loss values and d(sum of the loss)/d logps."""
    out = token_loss(logps, **kwargs)
    out.loss.sum().backward()
    return out.loss.detach()[0].tolist(), logps.grad[0].tolist()


# ---- dual-clip ----------------------------------------------------------------------------------


def test_dual_clip_caps_a_negative_advantage_tokens_loss_at_c_times_its_advantage() -> None:
    """A = -1, ratios 5 and 2, eps 0.2: the clipped surrogate's loss is r·|A| (5 and 2, gradient r);
    with c = 3 the first is capped at 3 and its gradient stops; positive advantages are untouched."""
    old = torch.zeros(1, 2, dtype=torch.float64)
    ratios = [math.log(5.0), math.log(2.0)]
    kwargs = {"old_logps": old, "mask": torch.ones(1, 2, dtype=torch.float64), "epsilons": EPS}
    plain = loss_and_grad(leaf(ratios), advantages=torch.tensor([-1.0]), algo=AlgoConfig(), **kwargs)
    assert plain[0] == pytest.approx([5.0, 2.0]) and plain[1] == pytest.approx([5.0, 2.0])
    dual = AlgoConfig(clip_ratio_c=3.0)
    loss, grad = loss_and_grad(leaf(ratios), advantages=torch.tensor([-1.0]), algo=dual, **kwargs)
    assert loss == pytest.approx([3.0, 2.0]) and grad == pytest.approx([0.0, 2.0])
    out = token_loss(leaf(ratios), advantages=torch.tensor([-1.0]), algo=dual, **kwargs)
    assert out.variants == {"clip_frac/dual": 1.0}
    positive = loss_and_grad(leaf(ratios), advantages=torch.tensor([1.0]), algo=dual, **kwargs)
    assert positive[0] == pytest.approx([-1.2, -1.2])  # clipped at 1 + eps as always, never capped by c


# ---- KL ratio correction -------------------------------------------------------------------------


def test_kl_ratio_correction_weights_k3_by_the_importance_ratio() -> None:
    """logp -1, old -1.2, ref -1.5, beta 0.5, A = 0: k3 = e^-0.5 + 0.5 - 1 = 0.10653, its gradient
    1 - e^-0.5 = 0.39347; weighted by r = e^0.2 the loss is 0.5·r·k3 and the gradient
    0.5·r·(k3 + 0.39347) = 0.5·r·0.5 (TRL's use_bias_correction_kl)."""
    k3, dk3 = math.exp(-0.5) - 0.5, 1 - math.exp(-0.5)
    r = math.exp(0.2)
    kwargs = {
        "old_logps": torch.tensor([[-1.2]], dtype=torch.float64),
        "ref_logps": torch.tensor([[-1.5]], dtype=torch.float64),
        "advantages": torch.tensor([0.0]),
        "mask": torch.ones(1, 1, dtype=torch.float64),
        "epsilons": EPS,
    }
    plain = loss_and_grad(leaf([-1.0]), algo=AlgoConfig(beta=0.5), **kwargs)
    assert plain[0] == pytest.approx([0.5 * k3]) and plain[1] == pytest.approx([0.5 * dk3])
    corrected = loss_and_grad(leaf([-1.0]), algo=AlgoConfig(beta=0.5, kl_ratio_correction=True), **kwargs)
    assert corrected[0] == pytest.approx([0.5 * r * k3]) and corrected[1] == pytest.approx([0.5 * r * 0.5])


# ---- high-entropy tokens -------------------------------------------------------------------------


def test_top_entropy_quantile_keeps_gradient_on_the_forking_tokens_only() -> None:
    """Entropies 0.1, 0.5, 0.9, 0.3 (and a masked 5.0 that must not count): quantile 0.5 keeps the
    tokens at or above the median 0.4 (0.5 and 0.9); 0.25 keeps those at or above 0.6 (0.9 only)."""
    entropies = torch.tensor([[0.1, 0.5, 0.9, 0.3, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    base = {"old_logps": torch.zeros(1, 5, dtype=torch.float64), "advantages": torch.tensor([1.0])}
    for quantile, kept in ((0.5, [0.0, 1.0, 1.0, 0.0, 0.0]), (0.25, [0.0, 0.0, 1.0, 0.0, 0.0])):
        algo = AlgoConfig(top_entropy_quantile=quantile)
        logps = leaf([0.0] * 5)
        out = token_loss(logps, mask=mask, algo=algo, epsilons=EPS, entropies=entropies, **base)
        (out.loss * mask).sum().backward()
        assert out.tokens[0].tolist() == kept
        assert logps.grad[0].tolist() == pytest.approx([-k for k in kept])  # -A·r on the kept tokens only
        assert out.variants["entropy/selected"] == sum(kept)
    with pytest.raises(ValueError, match="entropies"):
        token_loss(leaf([0.0] * 5), mask=mask, algo=AlgoConfig(top_entropy_quantile=0.2), epsilons=EPS, **base)


# ---- rollout correction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "cap", "expected"),
    [
        # log pi_policy - log pi_engine = 0.5, 0, 2 per token; 2.5 for the sequence
        ("token_truncate", 2.0, [math.exp(0.5), 1.0, 2.0]),
        ("token_mask", 2.0, [math.exp(0.5), 1.0, 0.0]),
        ("sequence_truncate", 2.0, [2.0, 2.0, 2.0]),
        ("sequence_mask", 2.0, [0.0, 0.0, 0.0]),
        ("sequence_truncate", 20.0, [math.exp(2.5)] * 3),
    ],
)
def test_rollout_correction_weights_each_token_by_policy_over_engine(mode, cap, expected) -> None:
    """A = -1 at ratio 1: the loss is A's magnitude times the weight, token by token."""
    algo = AlgoConfig(rollout_correction=RolloutCorrectionConfig(mode=mode, cap=cap))
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    engine = torch.tensor([[-1.5, -1.0, -3.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    out = token_loss(
        leaf([-1.0] * 3), old, torch.tensor([-1.0]), mask, algo, EPS, engine_logps=engine
    )  # the weight is computed from old_logps, the policy that sampled
    assert out.loss[0].tolist() == pytest.approx(expected)
    capped = sum(1.0 for w in expected if w in (0.0, cap))
    assert out.variants["rollout_correction/capped"] == (3.0 if mode.startswith("sequence") and cap == 2.0 else capped)


def test_no_engine_log_probs_or_mode_none_leave_the_loss_alone() -> None:
    """The hf backend has no engine log-probs (it samples from the policy); mode none ignores them;
    a NaN engine log-prob (a stop token vLLM did not score) counts as agreement."""
    old, mask, adv = torch.full((1, 2), -1.0), torch.ones(1, 2), torch.tensor([-1.0])
    engine = torch.tensor([[-3.0, math.nan]])
    plain = token_loss(leaf([-1.0, -1.0]).float(), old, adv, mask, AlgoConfig(), EPS).loss
    off = AlgoConfig(rollout_correction=RolloutCorrectionConfig(mode="none"))
    ignored = token_loss(leaf([-1.0, -1.0]).float(), old, adv, mask, off, EPS, engine_logps=engine).loss
    assert torch.equal(ignored, plain)
    on = token_loss(leaf([-1.0, -1.0]).float(), old, adv, mask, AlgoConfig(), EPS, engine_logps=engine)
    assert on.loss[0].tolist() == pytest.approx([2.0, 1.0])  # e^2 capped at 2; NaN: weight 1


# ---- through policy_update on the real tiny model -----------------------------------------------


def test_an_engine_twice_less_likely_doubles_the_update(base_model, rollout) -> None:
    """Engine log-probs log 2 below the policy's: every weight is 2 (under the cap of 3), so with SGD
    at lr 1 the weights move exactly twice as far as without the correction."""
    with torch.no_grad():
        rows = torch.arange(rollout.completion_ids.size(0))
        logps, _ = rows_logprobs(base_model, rollout, rows, 1.0, "padded", with_entropy=False)
    engine_rollout = dataclasses.replace(rollout, engine_logps=logps - math.log(2.0))
    algo = AlgoConfig(rollout_correction=RolloutCorrectionConfig(mode="token_truncate", cap=3.0))
    adv, start = advantages_for(rollout, seed=2), flat(base_model)
    plain, doubled = copy.deepcopy(base_model), copy.deepcopy(base_model)
    run_update(plain, rollout, adv, algo=algo)
    stats, _, _ = run_update(doubled, engine_rollout, adv, algo=algo)
    torch.testing.assert_close(flat(doubled) - start, 2 * (flat(plain) - start), rtol=1e-4, atol=1e-6)
    assert (flat(plain) - start).abs().max() > 1e-3  # the update moved the weights: the comparison means something
    assert stats.metrics()["rollout_correction/weight"] == pytest.approx(2.0, rel=1e-5)
    assert stats.metrics()["rollout_correction/capped"] == 0.0


def test_the_entropy_bonus_raises_the_policys_entropy_and_is_the_loss_alone(base_model, rollout) -> None:
    """Zero advantages, beta 0: without the bonus nothing moves; with it the step's loss is
    -coef·(mean token entropy) and one SGD step raises that mean on the same completions."""
    zero = torch.zeros(rollout.completion_ids.size(0))
    still = copy.deepcopy(base_model)
    run_update(still, rollout, zero)
    assert torch.equal(flat(still), flat(base_model))

    model = copy.deepcopy(base_model)
    stats, _, _ = run_update(model, rollout, zero, algo=AlgoConfig(entropy_coef=0.01))
    assert stats.loss == pytest.approx(-0.01 * stats.entropy, rel=1e-5)
    after, _, _ = run_update(copy.deepcopy(model), rollout, zero)  # measures the moved policy, moves nothing we keep
    assert after.entropy > stats.entropy


def test_the_rollout_correction_weighs_by_the_behaviour_policy_after_the_policy_moved(base_model, rollout) -> None:
    """Two passes over the rollout, engine log-probs log 2 below the behaviour policy's: each token's
    weight is pi_old/pi_engine = 2 in both passes, although the second pass's policy has moved (its
    pi/pi_engine is no longer 2: the importance ratio carries that part)."""
    with torch.no_grad():
        rows = torch.arange(rollout.completion_ids.size(0))
        behaviour, _ = rows_logprobs(base_model, rollout, rows, 1.0, "padded", with_entropy=False)
    engine_rollout = dataclasses.replace(rollout, engine_logps=behaviour - math.log(2.0))
    algo = AlgoConfig(num_iterations=2, rollout_correction=RolloutCorrectionConfig(mode="token_truncate", cap=3.0))
    model = copy.deepcopy(base_model)
    stats, _, _ = run_update(model, engine_rollout, advantages_for(rollout, seed=2), algo=algo)
    assert stats.optimizer_steps == 2 and stats.clip_frac_low + stats.clip_frac_high > 0  # the second pass moved
    assert stats.metrics()["rollout_correction/weight"] == pytest.approx(2.0, rel=1e-5)
    assert stats.metrics()["rollout_correction/capped"] == 0.0


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_the_entropy_bonus_is_the_steps_mean_entropy_over_its_loss_tokens(base_model, rollout, grad_accum) -> None:
    """Zero advantages, beta 0, SGD at lr 1: the loss is -coef·(mean token entropy over the step's
    loss tokens), so the weights move by coef times that mean's gradient, computed here from the
    logits; rows out of the loss mask count in neither the sum nor the count, and the micro-batches
    (of unequal token counts) share one mean."""
    mask = rollout.completion_mask.float()
    mask[[0, 5, 6, 13, 22]] = 0  # out of the loss: the micro-batches keep unequal token counts
    coef, reference = 0.5, copy.deepcopy(base_model)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = reference(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    entropy = torch.distributions.Categorical(logits=logits[:, -rollout.completion_ids.size(1) - 1 : -1].float())
    ((entropy.entropy() * mask).sum() / mask.sum()).backward()
    with torch.no_grad():
        expected = flat(base_model) + coef * torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    model = copy.deepcopy(base_model)
    run_update(model, rollout, torch.zeros(mask.size(0)), mask, AlgoConfig(entropy_coef=coef), grad_accum)
    assert (expected - flat(base_model)).abs().max() > 1e-3  # the bonus moves the weights: the check means something
    torch.testing.assert_close(flat(model), expected, rtol=0, atol=1e-6)


def test_variant_figures_are_reported_only_while_their_term_is_on(base_model, rollout) -> None:
    adv = advantages_for(rollout, seed=3)
    plain, _, _ = run_update(copy.deepcopy(base_model), rollout, adv)
    assert not {"clip_frac/dual", "entropy/selected", "rollout_correction/weight"} & set(plain.metrics())
    algo = AlgoConfig(clip_ratio_c=3.0, top_entropy_quantile=0.2, entropy_coef=0.001)
    stats, _, _ = run_update(copy.deepcopy(base_model), rollout, adv, algo=algo)
    metrics = stats.metrics()
    assert metrics["clip_frac/dual"] == 0.0  # a single update: every ratio is 1
    assert 0.15 <= metrics["entropy/selected"] <= 0.3  # about the top 20% of the loss tokens
