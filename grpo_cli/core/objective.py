"""The per-token objective of one micro-batch: the clipped surrogate and the optional terms around
it, composed in one place so micro_step, the tests and the docs share one definition
(docs/architecture.md §3, "The loss, term by term").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from grpo_cli.config.schema import AlgoConfig
from grpo_cli.core.loss import (
    cispo_loss,
    clipped_surrogate,
    dual_clip,
    high_entropy_mask,
    importance_ratio,
    kl_penalty,
    off_policy_sequence_mask,
    rollout_correction,
    sapo_loss,
    vespo_loss,
    vespo_weight,
)
from grpo_cli.core.parallel import Collective, SingleProcess


@dataclass
class TokenLoss:
    """[B, T] per-token loss before aggregation, and what the step reports of it."""

    loss: torch.Tensor
    tokens: torch.Tensor  # [B, T] the tokens the entropy bonus averages over: the loss mask, or the selected ones
    clip_low: torch.Tensor  # [B, T] bool: the lower clip changed the objective
    clip_high: torch.Tensor
    kl: torch.Tensor | None  # [B, T] the KL estimate (without the ratio weight); None without a reference
    variants: dict[str, float] = field(default_factory=dict)  # UpdateStats.variants' sums over loss tokens


def token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: AlgoConfig,
    epsilons: tuple[float, float],
    *,
    ref_logps: torch.Tensor | None = None,
    engine_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    collective: Collective | None = None,
    selection: EntropySelection | None = None,
) -> TokenLoss:
    """The per-token loss, in TRL's order: the policy term (the clipped surrogate, dual-clipped with
    clip_ratio_c or its other name delta; or CISPO's, SAPO's or VESPO's by loss_type), without the
    off-policy negative sequences (off_policy_mask_threshold), kept on the high-entropy tokens only
    (top_entropy_quantile), weighted by the rollout correction (engine_logps; VESPO takes it into
    its sequence weight instead), plus β·KL (times the importance ratio with kl_ratio_correction).

    `old_logps` are the sampling policy's log-probs (logps.detach() for a single update);
    `entropies` are needed when top_entropy_quantile < 1, and `selection` is the optimizer step's
    threshold when the step spans several micro-batches (None: these tokens are the whole step).
    """
    collective = collective if collective is not None else SingleProcess()
    variants: dict[str, float] = {}
    ratio = importance_ratio(logps, old_logps, mask, algo.ratio_level)
    weights = correction_weights(old_logps, engine_logps, mask, algo, variants)
    loss, low, high = policy_term(logps, old_logps, ratio, advantages, mask, algo, epsilons, weights, variants)
    cap = algo.clip_ratio_c or algo.delta  # one bound under two names (core.loss.dual_clip); never both
    if cap > 0:
        loss, dual = dual_clip(loss, advantages, cap)
        variants["clip_frac/dual"] = (dual * mask).sum().item()
    if algo.off_policy_mask_threshold is not None:  # drift measured from the sampler: the engine's when it has one
        behaviour = engine_logps if engine_logps is not None else old_logps
        keep = off_policy_sequence_mask(logps, behaviour, advantages, mask, algo.off_policy_mask_threshold)
        loss = loss * keep
        variants["off_policy_mask/dropped"] = ((1 - keep) * mask).sum().item()
    tokens = mask
    if algo.top_entropy_quantile < 1:
        if entropies is None:
            raise ValueError("algo.top_entropy_quantile < 1 selects tokens by entropy: pass the entropies")
        if selection is None:
            selection = select_high_entropy(entropies[mask.bool()], algo.top_entropy_quantile, collective)
        tokens = high_entropy_mask(entropies.detach(), mask, selection.threshold).to(mask.dtype)
        loss = loss * tokens
        variants["entropy/selected"] = tokens.sum().item()
    if engine_logps is not None:  # how far the engine's policy is from the trained one (rollout/engine_gap)
        variants["rollout/engine_gap"] = engine_gap_sum(old_logps, engine_logps, mask)
    if weights is not None and algo.loss_type != "vespo":
        loss = loss * weights
    kl = None
    if ref_logps is not None:
        kl = kl_penalty(logps, ref_logps, algo.kl_estimator)
        loss = loss + algo.beta * (kl * ratio if algo.kl_ratio_correction else kl)
    return TokenLoss(loss, tokens, low, high, kl, variants)


def correction_weights(
    old_logps: torch.Tensor,
    engine_logps: torch.Tensor | None,
    mask: torch.Tensor,
    algo: AlgoConfig,
    variants: dict[str, float],
) -> torch.Tensor | None:
    """The rollout correction's [B, T] weights for tokens an engine other than the policy sampled,
    adding their sums to `variants`; None when nothing needs correcting (no engine figures, or
    algo.rollout_correction.mode=none).
    """
    if engine_logps is None or algo.rollout_correction.mode == "none":
        return None
    correction = algo.rollout_correction
    weights, capped = rollout_correction(old_logps, engine_logps, mask, correction.mode, correction.cap, correction.min)
    variants["rollout_correction/weight"] = (weights * mask).sum().item()
    variants["rollout_correction/capped"] = (capped * mask).sum().item()
    return weights


def policy_term(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: AlgoConfig,
    epsilons: tuple[float, float],
    weights: torch.Tensor | None,
    variants: dict[str, float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The [B, T] policy term that algo.loss_type names, with its lower and upper clip masks; the
    one place a new loss type plugs in (docs/architecture.md). VESPO folds the rollout correction's
    `weights` into its own sequence weight and adds `vespo/weight` to `variants`.
    """
    if algo.loss_type == "cispo":
        loss, high = cispo_loss(logps, ratio, advantages, epsilons[1])
        return loss, torch.zeros_like(high), high
    if algo.loss_type == "sapo":
        loss = sapo_loss(ratio, advantages, algo.sapo_temperature_pos, algo.sapo_temperature_neg)
        unclipped = torch.zeros_like(loss, dtype=torch.bool)  # a soft gate clips nothing
        return loss, unclipped, unclipped
    if algo.loss_type == "vespo":
        v = algo.vespo
        phi = vespo_weight(logps - old_logps, advantages, mask, (v.k_pos, v.lambda_pos, v.k_neg, v.lambda_neg), weights)
        loss = vespo_loss(logps, phi, advantages)
        variants["vespo/weight"] = (phi * mask).sum().item()
        unclipped = torch.zeros_like(loss, dtype=torch.bool)  # a smooth weight clips nothing
        return loss, unclipped, unclipped
    return clipped_surrogate(ratio, advantages, *epsilons)


def engine_gap_sum(policy_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """Σ |policy − engine| log-prob over the loss tokens, the policy's from the pass under the
    sampling weights (old_logps): divided by the loss tokens it is `rollout/engine_gap`, at the
    kernels' noise floor when the engine holds the trained weights and growing with the lr when it
    holds stale ones. A token without an engine figure (NaN: a stop token put back) counts as 0.

    >>> engine_gap_sum(torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, float("nan"), 0.0]]),
    ...                torch.tensor([[1.0, 1.0, 0.0]]))
    0.5
    """
    gap = (policy_logps.detach() - engine_logps).abs().nan_to_num(nan=0.0)
    return (gap * mask).sum().item()


@dataclass
class EntropySelection:
    """The optimizer step's high-entropy tokens (top_entropy_quantile < 1), decided once over every
    micro-batch of the step and every process, so that gradient accumulation changes memory and not
    which tokens train (docs/architecture.md §3)."""

    threshold: float  # the (1 - quantile) quantile of the step's loss-token entropies; inf: no loss token
    tokens: float  # the loss tokens at or above it, over the step and every process: the bonus's count


def select_high_entropy(entropies: torch.Tensor, quantile: float, collective: Collective) -> EntropySelection:
    """The selection from this process's loss-token entropies of the whole step (1-D), gathered over
    every process (TRL's top_entropy_quantile, which TRL takes per forward batch)."""
    values = collective.gather(entropies.detach().float())
    if values.numel() == 0:
        return EntropySelection(math.inf, 0.0)
    threshold = quantile_value(values, 1 - quantile)
    return EntropySelection(threshold, float((values >= threshold).sum()))


def quantile_value(values: torch.Tensor, q: float) -> float:
    """torch.quantile(values, q), computed as it computes it (linear interpolation in the values'
    dtype): torch.quantile refuses more than 2**24 values, and a step's tokens over every process
    can be more.

    >>> quantile_value(torch.tensor([3.0, 1.0, 2.0, 4.0]), 0.5)
    2.5
    """
    ordered = values.flatten().sort().values
    rank = torch.tensor(q, dtype=ordered.dtype) * (ordered.numel() - 1)  # in the values' dtype, as torch.quantile
    below = min(int(rank.floor()), ordered.numel() - 1)  # a float32 rank past 2**24 can round up
    above = min(below + 1, ordered.numel() - 1)
    return torch.lerp(ordered[below], ordered[above], rank - below).item()


def entropy_bonus(entropies: torch.Tensor, tokens: torch.Tensor, step_tokens: float) -> torch.Tensor:
    """This micro-batch's share of the mean entropy over `tokens` (the loss tokens, or the selected
    ones) of the whole optimizer step and every process, `step_tokens` of them: the same mean
    whatever the loss_type (as TRL) and whatever the micro-batches; the loss subtracts entropy_coef
    times it."""
    return (entropies * tokens).sum() / max(step_tokens, 1.0)
