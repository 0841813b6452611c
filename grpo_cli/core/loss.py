"""The per-token GRPO objective and its aggregation (docs/architecture.md §3)."""

from __future__ import annotations

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
    policy_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights pi_policy / pi_engine of tokens a different engine sampled (vLLM: other
    kernels, other precision), so the gradient is the policy's; capped (`*_truncate`) or zeroed
    above the cap (`*_mask`) to bound the variance, per token or per sequence (the sum of the
    sequence's log-ratios, as TRL). Returns (weights [B, T] or [B, 1], capped indicator of the same
    shape). No gradient flows through the weights.

    >>> w, capped = rollout_correction(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]),
    ...                                torch.ones(1, 2), "token_truncate", 2.0)
    >>> [round(v, 4) for v in w[0].tolist()], capped.tolist()
    ([2.0, 1.0], [[True, False]])
    """
    log_ratio = torch.nan_to_num(policy_logps.detach() - engine_logps, nan=0.0) * mask  # NaN: no engine figure
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    weights = torch.exp(log_ratio)
    capped = weights > cap
    if mode.endswith("truncate"):
        return weights.clamp(max=cap), capped
    if mode.endswith("mask"):
        return weights.masked_fill(capped, 0.0), capped
    raise ValueError(f"unknown rollout correction {mode!r}")


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

    grpo, sapo:  mean over sequences of (sum_t m*l / sum_t m)
    bnpo:        sum m*l / sum m within each micro-batch, averaged over micro-batches
    dr_grpo:     sum m*l / (B * max_new_tokens)
    dapo, cispo: sum m*l / (tokens in the whole mini-batch)
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
    if norm.loss_type in ("dapo", "cispo"):
        return masked.sum() / max(norm.tokens, 1)
    raise ValueError(f"unknown loss_type {norm.loss_type!r}")
