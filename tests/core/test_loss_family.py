"""The rest of the loss family (issues 24 and 38) with worked numbers on `token_loss`, the function
the update calls: CISPO, SAPO, VESPO, two-sided clipping, the off-policy sequence mask and the
rollout correction's floor; their aggregation (LUSPO's too). A changed formula changes a number
here (tests/core/test_vs_trl.py compares them with TRL 1.16 where it is installed)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, RolloutCorrectionConfig, VespoConfig
from grpo_cli.core.loss import LossNormalizer, aggregate_loss
from grpo_cli.core.objective import token_loss


def per_token(algo: AlgoConfig, logps: list[float], ratios: list[float], advantage: float, eps=(0.2, 0.2)):
    """(loss values, d(sum loss)/d logps, clip indicators) for one sequence whose tokens have these
    log-probs and ratios against the sampling policy."""
    lp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.log(torch.tensor([ratios], dtype=torch.float64))
    out = token_loss(lp, old, torch.tensor([advantage]), torch.ones_like(old), algo, eps)
    out.loss.sum().backward()
    return out.loss.detach()[0].tolist(), lp.grad[0].tolist(), out


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_cispo_weights_log_pi_by_the_capped_ratio_and_never_drops_a_gradient() -> None:
    """log pi -1 and -2 at ratios 6 and 1.1, A = 1, cap 5: loss -min(r, 5)·A·log pi = 5 and 2.2;
    the weight is a constant, so the gradient is -min(r, 5)·A = -5 and -1.1. PPO's clip gives the
    first token no gradient at all (ratio 6 > 1.2 with A > 0)."""
    algo = AlgoConfig(loss_type="cispo", epsilon_high=5.0)
    loss, grad, out = per_token(algo, [-1.0, -2.0], [6.0, 1.1], 1.0, eps=(0.2, 5.0))
    assert loss == pytest.approx([5.0, 2.2]) and grad == pytest.approx([-5.0, -1.1])
    assert out.clip_high[0].tolist() == [True, False] and not out.clip_low.any()
    _, ppo_grad, _ = per_token(AlgoConfig(), [-1.0, -2.0], [6.0, 1.1], 1.0)
    assert ppo_grad == pytest.approx([0.0, -1.1])  # -A·r where unclipped, 0 where clipped
    negative = per_token(algo, [-1.0], [0.1], -2.0, eps=(0.2, 5.0))
    assert negative[1] == pytest.approx([0.1 * 2.0])  # a ratio far below 1 still passes its (small) gradient


def test_sapo_gates_the_ratio_with_a_sigmoid_steeper_for_negative_advantages() -> None:
    """loss -(4/tau)·sigmoid(tau·(r - 1))·A; d/d log pi = -4·sigmoid'(tau·(r - 1))·r·A.
    At r = 1: loss -2A/tau, gradient -A (PPO's). At r = 2, A = 1, tau 1: -4·sigmoid(1) = -2.9242
    and -4·sigmoid'(1)·2. At r = 2, A = -1, tau_neg 1.05: (4/1.05)·sigmoid(1.05)."""
    algo = AlgoConfig(loss_type="sapo")  # tau_pos 1.0, tau_neg 1.05
    loss, grad, out = per_token(algo, [-1.0, -1.0], [1.0, 2.0], 1.0)
    ds = sigmoid(1.0) * (1 - sigmoid(1.0))
    assert loss == pytest.approx([-2.0, -4 * sigmoid(1.0)]) and grad == pytest.approx([-1.0, -4 * ds * 2])
    assert not out.clip_low.any() and not out.clip_high.any()  # nothing is clipped
    loss, grad, _ = per_token(algo, [-1.0, -1.0], [1.0, 2.0], -1.0)
    ds_neg = sigmoid(1.05) * (1 - sigmoid(1.05))
    assert loss == pytest.approx([2.0 / 1.05, 4 / 1.05 * sigmoid(1.05)])
    assert grad == pytest.approx([1.0, 4 * ds_neg * 2])


def test_two_sided_clipping_caps_the_ratio_on_negative_advantages_as_dual_clip_does() -> None:
    """A = -1, ratios 5 and 2, delta 3: the unclipped term's ratio is capped at 3, so the loss is 3
    (gradient 0) and 2 (gradient 2); positive advantages are clipped at 1 + eps as always. For
    delta > 1 + eps_high this is verl's dual-clip with c = delta, under TRL's name."""
    loss, grad, _ = per_token(AlgoConfig(delta=3.0), [-1.0, -1.0], [5.0, 2.0], -1.0)
    assert loss == pytest.approx([3.0, 2.0]) and grad == pytest.approx([0.0, 2.0])
    dual = per_token(AlgoConfig(clip_ratio_c=3.0), [-1.0, -1.0], [5.0, 2.0], -1.0)
    assert (loss, grad) == (pytest.approx(dual[0]), pytest.approx(dual[1]))
    positive, _, _ = per_token(AlgoConfig(delta=3.0), [-1.0], [5.0], 1.0)
    assert positive == pytest.approx([-1.2])


def phi(k: float, lam: float, log_w: float) -> float:
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


def test_vespo_weighs_reinforce_by_a_gamma_function_of_the_sequence_ratio() -> None:
    """log pi -1 and -2 at ratios 2 and 0.75 (sequence ratio w = 1.5), A = 1, k 2, lambda 3:
    phi = e^(3 + 2·log 1.5 - 4.5) = 0.5020; loss -phi·A·log pi = 0.5020 and 1.0041, and phi is a
    constant: the gradient is -phi·A on every token. A = -1 takes (k, lambda) = (3, 2). At w = 1
    phi is 1 and the gradient REINFORCE's."""
    algo = AlgoConfig(loss_type="vespo")
    loss, grad, out = per_token(algo, [-1.0, -2.0], [2.0, 0.75], 1.0)
    weight = phi(2.0, 3.0, math.log(1.5))
    assert weight == pytest.approx(0.50204, abs=1e-5)
    assert loss == pytest.approx([weight, 2 * weight]) and grad == pytest.approx([-weight, -weight])
    assert out.variants["vespo/weight"] == pytest.approx(2 * weight) and not out.clip_high.any()
    _, grad, _ = per_token(algo, [-1.0, -2.0], [2.0, 0.75], -1.0)
    assert grad == pytest.approx([phi(3.0, 2.0, math.log(1.5))] * 2)
    _, grad, _ = per_token(algo, [-1.0, -2.0], [2.0, 0.5], 1.0)
    assert grad == pytest.approx([-1.0, -1.0])
    other = AlgoConfig(loss_type="vespo", vespo=VespoConfig(k_pos=1.0, lambda_pos=1.0))
    assert per_token(other, [-1.0], [1.5], 1.0)[1] == pytest.approx([-phi(1.0, 1.0, math.log(1.5))])


def test_vespo_takes_the_rollout_correction_into_its_sequence_weight() -> None:
    """On-policy, an engine log 2 below the policy on both tokens: token weights 2 and 2 (cap 3),
    so w = 4 and the loss is phi(4)·(-A·log pi), not multiplied by the weights again."""
    algo = AlgoConfig(loss_type="vespo", rollout_correction=RolloutCorrectionConfig(cap=3.0))
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    out = token_loss(
        lp, lp.detach(), torch.tensor([1.0]), torch.ones(1, 2), algo, (0.2, 0.2), engine_logps=lp.detach() - math.log(2)
    )
    weight = phi(2.0, 3.0, math.log(4.0))
    assert out.loss.detach()[0].tolist() == pytest.approx([weight, 2 * weight])


def test_the_off_policy_mask_drops_negative_sequences_that_drifted_past_the_threshold() -> None:
    """Three sequences of two tokens, mean log(pi_old/pi) 0.75, 0.75 and 0.1, threshold 0.5: the
    first (A < 0) leaves the policy term, the second (A > 0) and the third (drift 0.1) stay; the KL
    term is not masked. Without engine log-probs the drift is old's; with them, the engine's."""
    lp = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[1.0, 0.5], [1.0, 0.5], [0.0, 0.2]], dtype=torch.float64)
    adv, mask = torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2, dtype=torch.float64)
    algo = AlgoConfig(off_policy_mask_threshold=0.5, epsilon_low=0.9, epsilon_high=9.0)  # no clip acts here
    out = token_loss(lp, old, adv, mask, algo, (0.9, 9.0))
    ratio = torch.exp(-old)
    expected = torch.stack([torch.zeros(2), -ratio[1], ratio[2]]).tolist()
    assert out.loss.detach().tolist() == [pytest.approx(row) for row in expected]
    assert out.variants["off_policy_mask/dropped"] == 2.0  # the first sequence's two tokens
    engine = torch.zeros(3, 2, dtype=torch.float64)  # the engine saw no drift: nothing dropped
    assert (
        token_loss(lp, old, adv, mask, algo, (0.9, 9.0), engine_logps=engine).variants["off_policy_mask/dropped"] == 0
    )
    kl = token_loss(lp, old, adv, mask, AlgoConfig(off_policy_mask_threshold=0.5, beta=0.1), (0.9, 9.0),
                    ref_logps=torch.full((3, 2), -1.0, dtype=torch.float64))  # fmt: skip
    assert kl.loss.detach()[0].tolist() == pytest.approx([0.1 * (math.exp(-1) + 1 - 1)] * 2)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token_truncate", [0.5, 1.0, 2.0]), ("token_mask", [0.0, 1.0, 0.0])],
)
def test_the_rollout_corrections_floor_raises_or_drops_the_tokens_below_it(mode: str, expected: list[float]) -> None:
    """log pi_policy - log pi_engine = -2, 0, 1 at ratio 1, A = -1, bounds [0.5, 2]: e^-2 is below
    the floor (raised to it, or dropped), e^1 above the cap."""
    algo = AlgoConfig(rollout_correction=RolloutCorrectionConfig(mode=mode, cap=2.0, min=0.5))
    lp = torch.full((1, 3), -1.0, dtype=torch.float64)
    engine = torch.tensor([[1.0, -1.0, -2.0]], dtype=torch.float64)
    out = token_loss(lp, lp, torch.tensor([-1.0]), torch.ones(1, 3), algo, (0.2, 0.2), engine_logps=engine)
    assert out.loss[0].tolist() == pytest.approx(expected)
    assert out.variants["rollout_correction/capped"] == 2.0


@pytest.mark.parametrize(("loss_type", "like"), [("cispo", "dapo"), ("sapo", "grpo"), ("vespo", "dapo")])
def test_cispo_averages_over_the_batchs_tokens_and_sapo_over_sequences(loss_type: str, like: str) -> None:
    """As TRL: cispo's and vespo's denominator is dapo's (tokens in the mini-batch), sapo's is grpo's."""
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])

    def normalizer(kind: str) -> LossNormalizer:
        return LossNormalizer(kind, sequences=2, tokens=4, max_new_tokens=3, micro_batches=1)

    got = aggregate_loss(losses, mask, normalizer(loss_type)).item()
    assert got == aggregate_loss(losses, mask, normalizer(like)).item()
    assert got == pytest.approx(10 / 4 if like == "dapo" else (2.0 + 4.0) / 2)
