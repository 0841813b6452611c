"""policy_update: one call per rollout batch, `num_iterations` passes over mini-batches of whole
groups, one optimizer step each (DESIGN.md §3, "Updates per rollout").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from grpo_cli.config.schema import AlgoConfig
from grpo_cli.core.logprobs import completion_logprobs_and_entropy, packed_completion_logprobs_and_entropy
from grpo_cli.core.loss import LossNormalizer, aggregate_loss, clipped_surrogate, importance_ratio, kl_penalty
from grpo_cli.core.packing import choose_layout
from grpo_cli.rollout.base import Rollout

AutocastFactory = Callable[[], contextlib.AbstractContextManager]
PACKABLE_ATTENTION = ("eager", "sdpa")  # attention implementations that use a 4-D mask as given: auto may pack


class Collective(Protocol):
    """The sums a data-parallel update needs across its processes (training.distributed.World):
    loss denominators and reported figures must count the global batch, not one process's share."""

    size: int  # processes; a wrapped model's gradients are averaged over them

    def sum(self, values: torch.Tensor) -> torch.Tensor: ...


class SingleProcess:
    """One process: every sum is the local value."""

    size = 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper: its config, and passes without gradients."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@dataclass
class UpdateSettings:
    """What the update needs beyond `algo.*`; the trainer fills it from the config once."""

    temperature: float  # rollout.temperature: log-probs of the distribution that sampled
    max_new_tokens: int  # dr_grpo's constant denominator
    grad_accum_steps: int  # micro-batches per optimizer step: memory, not maths
    max_grad_norm: float  # 0: no clipping (the norm is still measured)
    layout: str  # train.layout: packed | padded | auto (core.packing.choose_layout per micro-batch)


@dataclass
class UpdateStats:
    loss: float  # mean over optimizer steps of the step's full loss
    kl: float | None  # mean per loss token; None when beta = 0 (no reference)
    clip_frac_low: float  # share of loss tokens whose lower clip changed the objective
    clip_frac_high: float
    grad_norm: float  # mean over applied steps, before clipping; NaN when none was applied
    optimizer_steps: int  # applied steps (what the scheduler counted)
    skipped_updates: int  # non-finite loss or gradient: weights and optimizer state left alone
    entropy: float  # mean entropy (nats) over the completions' tokens, under the policy that sampled them

    def metrics(self) -> dict[str, float | int | None]:
        return {
            "loss": self.loss,
            "entropy": self.entropy,
            "kl": self.kl,
            "clip_frac": self.clip_frac_low + self.clip_frac_high,
            "clip_frac/low": self.clip_frac_low,
            "clip_frac/high": self.clip_frac_high,
            "grad_norm": self.grad_norm,
            "optimizer_steps": self.optimizer_steps,
            "skipped_updates": self.skipped_updates,
        }


def plan_mini_batches(
    num_groups: int, group_size: int, mini_batches: int, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """Row indices of exactly `mini_batches` mini-batches of whole groups, in a random group order.

    `tensor_split` gives exactly the count asked for (sizes differ by at most one group), where
    `chunk` may return fewer and leave the LR schedule longer than the run.

    >>> [rows.tolist() for rows in plan_mini_batches(3, 2, 2, torch.Generator().manual_seed(0))]
    [[4, 5, 0, 1], [2, 3]]
    """
    if not 1 <= mini_batches <= num_groups:
        raise ValueError(f"{mini_batches} mini-batches need between 1 and {num_groups} groups each")
    order = torch.randperm(num_groups, generator=generator)
    return [
        (groups.unsqueeze(1) * group_size + torch.arange(group_size)).reshape(-1)
        for groups in order.tensor_split(mini_batches)
    ]


@dataclass
class EntropySum:
    """Token entropies summed over the completion mask, measured on the pass that sees every row
    under the sampling policy: the behaviour pass when there is one, else the single update pass."""

    total: float = 0.0
    tokens: float = 0.0

    def add(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        self.total += (entropies * mask).sum().item()
        self.tokens += mask.sum().item()

    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else math.nan


def rows_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    rows: torch.Tensor,
    temperature: float,
    layout: str,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) [len(rows), C] of these rollout rows, in the layout `layout`
    picks for them (`core.packing.choose_layout`): the one forward pass every update pass makes."""
    prompt_ids, prompt_mask = rollout.prompt_ids[rows], rollout.prompt_mask[rows]
    completion_ids, completion_mask = rollout.completion_ids[rows], rollout.completion_mask[rows]
    groups = rows // rollout.group_size
    config = unwrap(model).config
    if layout == "auto" and getattr(config, "_attn_implementation", None) not in PACKABLE_ATTENTION:
        layout = "padded"  # e.g. flash attention takes no 4-D mask
    if choose_layout(layout, prompt_mask, completion_mask, groups, config.hidden_size) == "packed":
        return packed_completion_logprobs_and_entropy(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, groups, temperature, with_entropy
        )
    return completion_logprobs_and_entropy(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature, with_entropy
    )


@torch.no_grad()
def _logprobs_no_grad(
    model: torch.nn.Module,
    rollout: Rollout,
    micro: int,
    settings: UpdateSettings,
    autocast: AutocastFactory,
    entropy: EntropySum | None = None,
) -> torch.Tensor:
    chunks = []
    for idx in torch.arange(rollout.completion_ids.size(0), device=rollout.completion_ids.device).split(micro):
        with autocast():
            logps, entropies = rows_logprobs(
                model, rollout, idx, settings.temperature, settings.layout, with_entropy=entropy is not None
            )
        if entropy is not None:
            entropy.add(entropies, rollout.completion_mask[idx])
        chunks.append(logps)
    return torch.cat(chunks)


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rollout: Rollout,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    algo: AlgoConfig,
    settings: UpdateSettings,
    reference: torch.nn.Module | None = None,
    autocast: AutocastFactory = contextlib.nullcontext,
    on_first_step: Callable[[], None] | None = None,
    epsilons: tuple[float, float] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    collective: Collective | None = None,
) -> UpdateStats:
    """Clipped-surrogate (+ β·KL) updates on one rollout batch.

    `loss_mask` [N, C] is the completion mask with unscorable (and, with mask_truncated,
    truncated) rows zeroed: loss denominators count its tokens and sequences only. The scheduler
    steps with the optimizer, so a skipped non-finite step is not counted. `on_first_step` runs
    just before the first optimizer step moves the weights (the trainer's point of no return).
    `epsilons` (low, high) replace `algo.epsilon_*` for this batch (adaptive clipping). `scaler`
    (fp16) scales the loss before backward and unscales before clipping; an overflowing step is
    skipped like any non-finite one, and the scaler lowers its scale.

    Data-parallel (`collective` over N processes, `model` wrapped in DistributedDataParallel):
    each process holds its share of the groups; denominators (sequences, tokens, each
    micro-batch's tokens for bnpo) are summed over the processes, and each share's loss is scaled
    by N because DDP averages gradients, so the summed gradient is the one process's gradient on
    the global batch. Reported figures are global sums too, so every process takes the same
    skip decision and returns the same stats.
    """
    collective = collective if collective is not None else SingleProcess()
    eps_low, eps_high = epsilons if epsilons is not None else (algo.epsilon_low, algo.epsilon_high)
    n, g = advantages.size(0), rollout.group_size
    device = advantages.device
    micro_size = max(1, math.ceil(n / settings.grad_accum_steps))
    # Stored behaviour log-probs only when the policy moves before the last update; with a
    # single update old = stop_gradient(lp), which costs no extra forward pass.
    reuse_old = algo.num_iterations > 1 or algo.mini_batches > 1
    entropy = EntropySum()
    sampler = unwrap(model)  # passes without gradients skip the DDP wrapper: nothing to synchronise
    old_logps = _logprobs_no_grad(sampler, rollout, micro_size, settings, autocast, entropy) if reuse_old else None
    ref_logps = _logprobs_no_grad(reference, rollout, micro_size, settings, autocast) if reference is not None else None
    max_norm = settings.max_grad_norm if settings.max_grad_norm > 0 else math.inf
    loss_sum = kl_sum = low_sum = high_sum = tokens = 0.0
    norms: list[float] = []
    steps = skipped = 0
    for _ in range(algo.num_iterations):
        for rows in plan_mini_batches(n // g, g, algo.mini_batches):
            rows = rows.to(device)
            mask_mb = loss_mask[rows]
            micro_batches = rows.tensor_split(min(settings.grad_accum_steps, rows.numel()))
            counts = collective.sum(
                torch.tensor(
                    [float((mask_mb.sum(-1) > 0).sum()), float(mask_mb.sum())]
                    + [float(loss_mask[micro].sum()) for micro in micro_batches],
                    dtype=torch.float64,
                )
            ).tolist()
            norm = LossNormalizer(
                loss_type=algo.loss_type,
                sequences=int(counts[0]),
                tokens=int(counts[1]),
                max_new_tokens=settings.max_new_tokens,
                micro_batches=len(micro_batches),
            )
            step_loss = 0.0
            for micro, micro_tokens in zip(micro_batches, counts[2:]):
                with autocast():
                    logps, entropies = rows_logprobs(
                        model,
                        rollout,
                        micro,
                        settings.temperature,
                        settings.layout,
                        with_entropy=not reuse_old,  # one update: this pass sees every row, unmoved
                    )
                if not reuse_old:
                    entropy.add(entropies, rollout.completion_mask[micro])
                old = old_logps[micro] if old_logps is not None else logps.detach()
                mask = loss_mask[micro]
                ratio = importance_ratio(logps, old, mask, algo.ratio_level)
                per_token, low, high = clipped_surrogate(ratio, advantages[micro], eps_low, eps_high)
                if ref_logps is not None:
                    kl = kl_penalty(logps, ref_logps[micro], algo.kl_estimator)
                    per_token = per_token + algo.beta * kl
                    kl_sum += (kl.detach() * mask).sum().item()
                loss = aggregate_loss(per_token, mask, norm, micro_tokens)
                shared = loss * collective.size  # DDP averages the processes' gradients; the loss is their sum
                (scaler.scale(shared) if scaler is not None else shared).backward()
                step_loss += loss.item()
                low_sum += (low * mask).sum().item()
                high_sum += (high * mask).sum().item()
                tokens += mask.sum().item()
            step_loss = collective.sum(torch.tensor([step_loss], dtype=torch.float64)).item()
            if scaler is not None:
                scaler.unscale_(optimizer)  # clip and measure the true gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
            if math.isfinite(grad_norm) and math.isfinite(step_loss):
                if on_first_step is not None and steps == 0:
                    on_first_step()
                if scaler is not None:
                    scaler.step(optimizer)
                else:
                    optimizer.step()
                scheduler.step()
                steps += 1
                norms.append(grad_norm)
                loss_sum += step_loss
            else:  # a non-finite step would poison the weights and Adam's moments: skip and count it
                skipped += 1
            if scaler is not None:
                scaler.update()  # grows the scale after clean steps, halves it after an overflow
            optimizer.zero_grad(set_to_none=True)
    totals = [kl_sum, low_sum, high_sum, tokens, entropy.total, entropy.tokens]
    kl_sum, low_sum, high_sum, tokens, entropy.total, entropy.tokens = collective.sum(
        torch.tensor(totals, dtype=torch.float64)
    ).tolist()
    tokens = max(tokens, 1.0)
    return UpdateStats(
        loss=loss_sum / steps if steps else math.nan,
        kl=kl_sum / tokens if ref_logps is not None else None,
        clip_frac_low=low_sum / tokens,
        clip_frac_high=high_sum / tokens,
        grad_norm=sum(norms) / len(norms) if norms else math.nan,
        optimizer_steps=steps,
        skipped_updates=skipped,
        entropy=entropy.mean(),
    )
