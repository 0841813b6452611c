"""The per-token GRPO objective and its aggregation (docs/architecture.md §3)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def importance_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """Per-token ratio pi/pi_old, shape [B, T].

    `sequence` (GSPO) uses exp of the length-normalised log-ratio, one value per sequence:
    exp of the raw sum over hundreds of tokens overflows.
    """
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        return torch.exp(seq).expand_as(logps)
    raise ValueError(f"unknown ratio level {level!r}")


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A) per token (PPO; DAPO's clip-higher).

    Returns (loss [B, T], clipped-low indicator, clipped-high indicator); a token counts as clipped
    only where the clip changed the objective.
    """
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * adv
    loss = -torch.min(unclipped, clipped)
    low = (ratio < 1 - epsilon_low) & (adv < 0)
    high = (ratio > 1 + epsilon_high) & (adv > 0)
    return loss, low, high


def cispo_loss(
    logps: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, epsilon_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1): -sg(min(rho, eps_high))·A·log pi per token. The clipped ratio is a
    stop-gradient weight, so no token's gradient is ever dropped (PPO's clip zeroes it), only
    damped; `epsilon_high` is the weight's cap (the paper and ScaleRL use about 5). Returns (loss,
    capped indicator).

    >>> loss, capped = cispo_loss(torch.tensor([[-1.0, -2.0]]), torch.tensor([[6.0, 2.0]]), torch.tensor([1.0]), 5.0)
    >>> loss.tolist(), capped.tolist()
    ([[5.0, 4.0]], [[True, False]])
    """
    weight = ratio.clamp(max=epsilon_high).detach()
    return -weight * advantages.unsqueeze(-1) * logps, (ratio > epsilon_high).expand_as(logps)


def sapo_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO (soft adaptive policy optimization): -(4/tau)·sigmoid(tau·(rho - 1))·A per token, a
    smooth gate in place of the hard clip: at rho = 1 its gradient is -A, as PPO's, and it fades
    as rho leaves 1 instead of dropping to zero at 1 ± eps; tau is `temperature_pos` where A > 0,
    `temperature_neg` elsewhere.

    >>> [round(v, 4) for v in sapo_loss(torch.tensor([[1.0, 2.0]]), torch.tensor([1.0]), 1.0, 1.05)[0].tolist()]
    [-2.0, -2.9242]
    """
    adv = advantages.unsqueeze(-1)
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv


def dual_clip(loss: torch.Tensor, advantages: torch.Tensor, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's dual-clip (Ye et al. 2020): on a negative-advantage token the clipped surrogate's loss
    grows with the ratio without bound, so one stale token with a huge ratio can dominate a step;
    it is capped at -clip_ratio_c·A, where its gradient stops. INTELLECT-2's two-sided clipping
    (TRL's `delta`, which must exceed 1 + eps_high) caps the unclipped ratio at delta, which is
    the same bound with c = delta. Returns (loss, capped indicator).

    >>> loss, capped = dual_clip(torch.tensor([[5.0, 0.5, -2.0]]), torch.tensor([-1.0]), 3.0)
    >>> loss.tolist(), capped.tolist()
    ([[3.0, 0.5, -2.0]], [[True, False, False]])
    """
    adv = advantages.unsqueeze(-1)
    cap = -adv * clip_ratio_c
    capped = (adv < 0) & (loss > cap)
    return torch.where(capped, cap.expand_as(loss), loss), capped


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B, T] the loss tokens whose entropy reaches the `threshold` value (a quantile of the batch's
    loss-token entropies): "Beyond the 80/20 rule" (Wang et al. 2025) trains only these forking
    tokens; the rest, near-certain, carry little signal and mostly noise."""
    return (entropies >= threshold) & mask.bool()


def rollout_correction(
    policy_logps: torch.Tensor,
    engine_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float,
    floor: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights pi_policy / pi_engine of tokens a different engine sampled (vLLM: other
    kernels, other precision), so the gradient is the policy's; bounded to [floor, cap]
    (`*_truncate`) or zeroed outside it (`*_mask`) to bound the variance, per token or per sequence
    (the sum of the sequence's log-ratios, as TRL). The floor (0: none) is for tokens the engine
    found far likelier than the policy does, whose tiny weight would silence them. Returns (weights
    [B, T] or [B, 1], indicator of the weights the bounds changed, same shape). No gradient flows
    through the weights.

    >>> w, capped = rollout_correction(torch.tensor([[0.0, -1.0, -3.0]]), torch.tensor([[-1.0, -1.0, -1.0]]),
    ...                                torch.ones(1, 3), "token_truncate", 2.0, 0.5)
    >>> [round(v, 4) for v in w[0].tolist()], capped.tolist()
    ([2.0, 1.0, 0.5], [[True, False, True]])
    """
    log_ratio = torch.nan_to_num(policy_logps.detach() - engine_logps, nan=0.0) * mask  # NaN: no engine figure
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    weights = torch.exp(log_ratio)
    capped = (weights > cap) | (weights < floor)
    if mode.endswith("truncate"):
        return weights.clamp(min=floor, max=cap), capped
    if mode.endswith("mask"):
        return weights.masked_fill(capped, 0.0), capped
    raise ValueError(f"unknown rollout correction {mode!r}")


def off_policy_sequence_mask(
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, [B, 1]: 0 for a sequence with A < 0 whose mean
    log(pi_behaviour / pi) per loss token exceeds `threshold`, 1 elsewhere. A negative advantage
    pushes down tokens the policy has already moved away from; on a sequence that far off-policy
    the push is mostly noise and destabilises training, while positive ones are kept whatever
    their drift. `behaviour_logps` are the sampler's: the engine's when it has its own (vLLM, so
    its mismatch counts too), else old. A token without a figure (NaN) counts 0. No gradient.

    >>> off_policy_sequence_mask(torch.zeros(3, 2), torch.tensor([[1.0, 0.5], [1.0, 0.5], [0.0, 0.2]]),
    ...                          torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2), 0.5).flatten().tolist()
    [0.0, 1.0, 1.0]
    """
    drift = torch.nan_to_num(behaviour_logps - logps.detach(), nan=0.0) * mask
    mean_drift = drift.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    keep = (advantages.unsqueeze(-1) >= 0) | (mean_drift <= threshold)
    return keep.to(logps.dtype)


VESPO_LOG_FLOOR = math.log(1e-8)  # the smallest sequence weight log w and log-correction VESPO keeps (as TRL)
VESPO_LOG_CEILING = 20.0  # the largest, per token and per sequence: exp(20) is already far past any phi > 0


def vespo_weight(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: tuple[float, float, float, float],
    correction: torch.Tensor | None = None,
) -> torch.Tensor:
    """VESPO's sequence weight phi(w) = exp(lambda + k·log w − lambda·w), [B, 1], no gradient: w is
    the sequence's importance ratio, the product over its loss tokens of pi/pi_old (times the
    rollout correction's token weights, `correction` [B, T], when an engine sampled), and (k,
    lambda) are params[0:2] where A >= 0, params[2:4] where A < 0. phi(1) = 1, so on-policy the
    loss is the policy gradient's; phi peaks at w = k/lambda and falls smoothly away from it (a
    power law towards 0, an exponential towards large w), where PPO's clip drops a token's gradient
    at once. Computed in log space: a product of hundreds of ratios under- or overflows.

    >>> phi = vespo_weight(torch.tensor([[0.0, 0.0], [0.5, 0.0]]), torch.tensor([1.0, -1.0]),
    ...                    torch.ones(2, 2), (2.0, 3.0, 3.0, 2.0))
    >>> [round(v, 4) for v in phi.flatten().tolist()]
    [1.0, 1.2245]
    """
    k_pos, lambda_pos, k_neg, lambda_neg = params
    log_w = (log_ratio.detach().clamp(-VESPO_LOG_CEILING, VESPO_LOG_CEILING) * mask).sum(-1, keepdim=True)
    if correction is not None:
        log_w = log_w + correction.log().clamp(VESPO_LOG_FLOOR, VESPO_LOG_CEILING).sum(-1, keepdim=True)
    log_w = log_w.clamp(VESPO_LOG_FLOOR, VESPO_LOG_CEILING)
    positive = advantages.unsqueeze(-1) >= 0
    k = torch.where(positive, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(positive, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp())
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(logps: torch.Tensor, phi: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """VESPO's token loss −phi·A·log pi, [B, T]: its gradient is phi·A·∇log pi, the REINFORCE
    gradient reweighted per sequence, so no ratio (and no clip) enters the gradient itself."""
    return -phi * advantages.unsqueeze(-1) * logps


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3)."""
    if estimator == "k1":
        return logps - ref_logps
    if estimator == "k2":
        return 0.5 * (logps - ref_logps) ** 2
    if estimator == "k3":
        delta = ref_logps - logps
        return torch.exp(delta) - delta - 1
    raise ValueError(f"unknown KL estimator {estimator!r}")


@dataclass
class LossNormalizer:
    """Totals over the whole optimizer step (mini-batch), so accumulation does not rescale.

    sequences/tokens count only sequences that are in the loss (scorable, not masked out).
    """

    loss_type: str
    sequences: int
    tokens: int
    max_new_tokens: int
    micro_batches: int


def completion_loss_mask(
    completion_mask: torch.Tensor, truncated: torch.Tensor, rewards: torch.Tensor, mask_truncated: bool
) -> torch.Tensor:
    """[N, C] the tokens the loss counts: unscorable completions (fused reward NaN) leave the loss and
    its denominators; with `mask_truncated` (DAPO's overlong filtering) so do truncated ones."""
    scorable = (~torch.isnan(rewards)).float()
    mask = completion_mask.float() * scorable.unsqueeze(1)
    if mask_truncated:
        mask = mask * (~truncated).float().unsqueeze(1)
    return mask


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNormalizer, micro_tokens: float | None = None
) -> torch.Tensor:
    """This micro-batch's share of the step's loss; summing the shares gives the full loss.

    `micro_tokens` (bnpo) counts the micro-batch's loss tokens over every data-parallel process,
    of which `mask` is one share; None: `mask` is the whole micro-batch.

    grpo, sapo:         mean over sequences of (sum_t m*l / sum_t m)
    bnpo:               sum m*l / sum m within each micro-batch, averaged over micro-batches
    dr_grpo:            sum m*l / (B * max_new_tokens)
    luspo:              sum m*l / B: each sequence's loss summed over its tokens (LUSPO), so a long
                        sequence weighs by its length and GSPO's bias against length goes
    dapo, cispo, vespo: sum m*l / (tokens in the whole mini-batch)
    """
    masked = per_token_loss * mask
    if norm.loss_type in ("grpo", "sapo"):
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / max(norm.sequences, 1)
    if norm.loss_type == "bnpo":
        tokens = mask.sum().clamp(min=1) if micro_tokens is None else max(micro_tokens, 1.0)
        return masked.sum() / tokens / norm.micro_batches
    if norm.loss_type == "dr_grpo":
        return masked.sum() / (max(norm.sequences, 1) * norm.max_new_tokens)
    if norm.loss_type == "luspo":
        return masked.sum() / max(norm.sequences, 1)
    if norm.loss_type in ("dapo", "cispo", "vespo"):
        return masked.sum() / max(norm.tokens, 1)
    raise ValueError(f"unknown loss_type {norm.loss_type!r}")
