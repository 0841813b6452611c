"""policy_update: one call per rollout batch, `num_iterations` passes over mini-batches of whole
groups, one optimizer step each (docs/architecture.md §3, "Updates per rollout").

The parts, in the order a step runs them: `step_normalizer` counts the loss denominators over
every process, `micro_step` runs the loss on one micro-batch and returns its partial sums,
`apply_step` owns clipping, the fp16 scaler and the skip rule, and `UpdateTotals` accumulates
what the step reports.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpo_cli.config.schema import AlgoConfig
from grpo_cli.core.entropy import AdaptiveEntropy, entropy_bonus_on
from grpo_cli.core.logprobs import RolloutRows, rows_logprobs, rows_pass
from grpo_cli.core.loss import LossNormalizer, aggregate_loss
from grpo_cli.core.objective import EntropySelection, TokenLoss, entropy_bonus, select_high_entropy, token_loss
from grpo_cli.core.optim import schedule_at
from grpo_cli.core.parallel import Collective, SingleProcess, unwrap
from grpo_cli.core.update_stats import EntropySum, MicroSums, UpdateStats, UpdateTotals

AutocastFactory = Callable[[], contextlib.AbstractContextManager]


@dataclass
class Learner:
    """The objects an update moves or reads: built once by the trainer, the same every step."""

    model: torch.nn.Module  # the policy; DDP-wrapped when data-parallel (forward and backward)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR  # steps with each applied optimizer step; see schedule_step
    reference: torch.nn.Module | None = None  # None: no KL term (beta = 0)
    autocast: AutocastFactory = contextlib.nullcontext  # mixed precision around each forward pass
    scaler: torch.amp.GradScaler | None = None  # fp16: scales the loss, unscales before clipping
    collective: Collective = field(default_factory=SingleProcess)  # data-parallel sums
    updates_per_step: int = 1  # optimizer steps planned per training step (num_iterations·mini_batches)

    def schedule_step(self, step: int) -> float:
        """Put the lr schedule at training step `step`'s first optimizer step, step·updates_per_step,
        and return the lr there. A step that applied fewer updates (dynamic sampling's short batch,
        no signal, a non-finite step) leaves the later steps' lr where it would have been; a resume
        lands on the same positions."""
        return schedule_at(self.scheduler, step * self.updates_per_step)


@dataclass
class UpdateBatch:
    """One rollout batch as the loss sees it."""

    rollout: RolloutRows
    advantages: torch.Tensor  # [N] this process's rows
    loss_mask: torch.Tensor  # [N, C] completion mask, unscorable (and masked truncated) rows zeroed


@dataclass
class UpdateSettings:
    """What the update needs beyond `algo.*`; the trainer fills it from the config once."""

    temperature: float  # rollout.temperature: log-probs of the distribution that sampled
    max_new_tokens: int  # dr_grpo's constant denominator
    grad_accum_steps: int  # micro-batches per optimizer step: memory, not maths (bnpo's per-micro-batch mean aside)
    max_grad_norm: float  # 0: no clipping (the norm is still measured)
    layout: str  # train.layout: packed | padded | auto (core.packing.choose_layout per micro-batch)
    # algo.router_aux_loss_coef resolved against the model (training.layout): 0 without a router loss
    router_aux_loss_coef: float = 0.0


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


def micro_batch_count(num_groups: int, group_size: int, mini_batches: int, grad_accum_steps: int) -> int:
    """Micro-batch passes in one pass over the batch: `plan_mini_batches`' mini-batches, each split
    `grad_accum_steps` ways (fewer ways when it has fewer rows).

    >>> micro_batch_count(3, 2, mini_batches=2, grad_accum_steps=4)  # mini-batches of 4 and 2 rows
    6
    """
    sizes = torch.arange(num_groups).tensor_split(mini_batches)
    return sum(min(grad_accum_steps, len(groups) * group_size) for groups in sizes)


def micro_batch_progress(
    report: Callable[[int, int], None] | None, num_groups: int, group_size: int, algo: AlgoConfig, grad_accum: int
) -> Callable[[], None]:
    """What policy_update calls before each micro-batch pass: `report(k, n)` for the k-th of the
    update's n (every iteration's), or nothing."""
    passes = algo.num_iterations * micro_batch_count(num_groups, group_size, algo.mini_batches, grad_accum)
    done = itertools.count(1)
    return (lambda: report(next(done), passes)) if report is not None else (lambda: None)


@dataclass
class Objective:
    """The batch's fixed terms of the loss, which every micro-step compares against."""

    algo: AlgoConfig
    epsilons: tuple[float, float]  # (low, high) clip range of this batch
    settings: UpdateSettings
    old_logps: torch.Tensor | None  # behaviour log-probs, stored when the policy moves before the last update
    ref_logps: torch.Tensor | None  # the reference's log-probs; None without a reference

    @property
    def reuse_old(self) -> bool:
        return self.old_logps is not None

    @property
    def needs_entropy(self) -> bool:
        """The update pass computes entropies: to report them (it is the only pass that sees the
        sampling policy), or because the loss uses them."""
        return not self.reuse_old or entropy_bonus_on(self.algo) or self.algo.top_entropy_quantile < 1


@torch.no_grad()
def logprobs_without_grad(
    model: torch.nn.Module,
    rollout: RolloutRows,
    micro: int,
    settings: UpdateSettings,
    autocast: AutocastFactory,
    entropy: EntropySum | None = None,
) -> torch.Tensor:
    """Log-probs [N, C] of every row, `micro` rows per forward pass: the behaviour policy's and the
    reference's, computed once per batch."""
    chunks = []
    for idx in torch.arange(rollout.completion_ids.size(0), device=rollout.completion_ids.device).split(micro):
        with autocast():
            logps, entropies = rows_logprobs(
                model, rollout, idx, settings.temperature, settings.layout, with_entropy=entropy is not None
            )
        if entropy is not None:
            entropy.add(entropies, rollout.model_mask[idx])
        chunks.append(logps)
    return torch.cat(chunks)


@torch.no_grad()
def step_entropy_selection(
    learner: Learner, batch: UpdateBatch, objective: Objective, micro_batches: tuple[torch.Tensor, ...]
) -> EntropySelection | None:
    """The high-entropy tokens of an optimizer step of several micro-batches, from a pass without
    gradient under the weights the step's gradient passes see (the quantile needs every entropy
    before the first backward). None when every token trains (top_entropy_quantile = 1) or the step
    is one micro-batch, whose gradient pass decides alone at no extra cost."""
    quantile = objective.algo.top_entropy_quantile
    if quantile >= 1 or len(micro_batches) < 2:
        return None
    settings, values = objective.settings, []
    for micro in micro_batches:
        with learner.autocast():
            _, entropies = rows_logprobs(
                unwrap(learner.model), batch.rollout, micro, settings.temperature, settings.layout, with_entropy=True
            )
        values.append(entropies[batch.loss_mask[micro].bool()])
    return select_high_entropy(torch.cat(values), quantile, learner.collective)


def step_normalizer(
    loss_mask: torch.Tensor,
    rows: torch.Tensor,
    micro_batches: tuple[torch.Tensor, ...],
    loss_type: str,
    max_new_tokens: int,
    collective: Collective,
) -> tuple[LossNormalizer, list[float]]:
    """The optimizer step's loss denominators, counted over every process: (normaliser, each
    micro-batch's loss tokens). Sequences and tokens count only rows in the loss."""
    mask = loss_mask[rows]
    counts = collective.sum(
        torch.tensor(
            [float((mask.sum(-1) > 0).sum()), float(mask.sum())]
            + [float(loss_mask[micro].sum()) for micro in micro_batches],
            dtype=torch.float64,
        )
    ).tolist()
    normalizer = LossNormalizer(
        loss_type=loss_type,
        sequences=int(counts[0]),
        tokens=int(counts[1]),
        max_new_tokens=max_new_tokens,
        micro_batches=len(micro_batches),
    )
    return normalizer, counts[2:]


def micro_token_loss(
    batch: UpdateBatch,
    objective: Objective,
    micro: torch.Tensor,
    logps: torch.Tensor,
    entropies: torch.Tensor | None,
    collective: Collective,
    selection: EntropySelection | None,
) -> TokenLoss:
    """`token_loss` on one micro-batch's rows: the step-wide tensors (old, reference and engine
    log-probs, advantages, loss mask) cut to `micro`; without stored old log-probs (a single update)
    the sampling policy is this pass's own, detached.
    """
    old = objective.old_logps[micro] if objective.old_logps is not None else logps.detach()
    rollout = batch.rollout
    return token_loss(
        logps,
        old,
        batch.advantages[micro],
        batch.loss_mask[micro],
        objective.algo,
        objective.epsilons,
        ref_logps=objective.ref_logps[micro] if objective.ref_logps is not None else None,
        engine_logps=rollout.engine_logps[micro] if rollout.engine_logps is not None else None,
        entropies=entropies,
        collective=collective,
        selection=selection,
    )


def router_loss_share(coef: float, aux_loss: torch.Tensor, micro_batches: int, processes: int) -> torch.Tensor:
    """One micro-batch's share of the router's auxiliary loss, as TRL adds it: coef·aux / the step's
    micro-batches, of the processes' mean aux (each process's aux is its own rows' mean, and
    micro_step scales the loss by the process count for DDP's averaging)."""
    return coef * aux_loss / (micro_batches * processes)


def entropy_sums(objective: Objective, mask: torch.Tensor, entropy: torch.Tensor, terms: TokenLoss) -> tuple:
    """A micro-batch's entropy sums over the model's tokens (the `entropy` figure: only where one update sees
    every row under the sampling policy), and over the bonus's tokens (what adaptive entropy measures)."""
    total = tokens = kept = kept_tokens = 0.0
    if not objective.reuse_old:
        total, tokens = (entropy.detach() * mask).sum().item(), mask.sum().item()
    if objective.algo.adaptive_entropy.enabled:
        kept, kept_tokens = (entropy.detach() * terms.tokens).sum().item(), terms.tokens.sum().item()
    return total, tokens, kept, kept_tokens


def micro_step(
    learner: Learner,
    batch: UpdateBatch,
    objective: Objective,
    micro: torch.Tensor,
    normalizer: LossNormalizer,
    micro_tokens: float,
    selection: EntropySelection | None = None,
    entropy_coef: float | None = None,
) -> MicroSums:
    """Forward and backward on one micro-batch: its share of the step's loss, and its sums.

    The per-token loss is `core.objective.token_loss`, aggregated by loss_type, minus the entropy
    bonus (docs/architecture.md §3). `selection`: the step's high-entropy tokens when the step has
    several micro-batches (`step_entropy_selection`); None: this micro-batch is the step.
    `entropy_coef`: the bonus's coefficient this optimizer step (adaptive entropy's); None:
    algo.entropy_coef.
    """
    algo, rollout, settings = objective.algo, batch.rollout, objective.settings
    aux_coef = settings.router_aux_loss_coef
    with learner.autocast():
        logps, entropies, aux_loss = rows_pass(
            learner.model,
            rollout,
            micro,
            settings.temperature,
            settings.layout,
            with_entropy=objective.needs_entropy,
            router_aux=aux_coef > 0,
        )
    mask = batch.loss_mask[micro]
    if algo.top_entropy_quantile < 1 and selection is None:  # the step's only micro-batch: its own entropies
        selection = select_high_entropy(entropies[mask.bool()], algo.top_entropy_quantile, learner.collective)
    terms = micro_token_loss(batch, objective, micro, logps, entropies, learner.collective, selection)
    loss = aggregate_loss(terms.loss, mask, normalizer, micro_tokens)
    coef = algo.entropy_coef if entropy_coef is None else entropy_coef
    if coef > 0:  # the mean over the step's kept tokens: the selected ones, else the loss tokens
        step_tokens = selection.tokens if selection is not None else normalizer.tokens
        loss = loss - coef * entropy_bonus(entropies, terms.tokens, step_tokens)
    variants = terms.variants
    if aux_loss is not None:
        loss = loss + router_loss_share(aux_coef, aux_loss, normalizer.micro_batches, learner.collective.size)
        variants = {**variants, "router/aux_loss": aux_loss.item() * mask.sum().item()}  # a mean per loss token
    entropy, entropy_tokens, kept, kept_tokens = entropy_sums(objective, rollout.model_mask[micro], entropies, terms)
    shared = loss * learner.collective.size  # DDP averages the processes' gradients; the loss is their sum
    (learner.scaler.scale(shared) if learner.scaler is not None else shared).backward()
    return MicroSums(
        loss=loss.item(),
        kl=(terms.kl.detach() * mask).sum().item() if terms.kl is not None else 0.0,
        clip_low=(terms.clip_low * mask).sum().item(),
        clip_high=(terms.clip_high * mask).sum().item(),
        tokens=mask.sum().item(),
        entropy=entropy,
        entropy_tokens=entropy_tokens,
        variants=variants,
        kept_entropy=kept,
        kept_tokens=kept_tokens,
    )


def apply_step(
    learner: Learner,
    step_loss: float,
    max_grad_norm: float,
    totals: UpdateTotals,
    on_first_step: Callable[[], None] | None = None,
) -> None:
    """Clip and apply the accumulated gradient, or skip the step when the loss or the gradient is
    not finite (it would poison the weights and Adam's moments); the gradient is cleared either way."""
    optimizer, scaler = learner.optimizer, learner.scaler
    step_loss = learner.collective.sum(torch.tensor([step_loss], dtype=torch.float64)).item()
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip and measure the true gradient
    max_norm = max_grad_norm if max_grad_norm > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(learner.model.parameters(), max_norm)
    # FSDP2's norm is a DTensor: the whole norm is its full tensor
    grad_norm = (norm.full_tensor() if callable(getattr(norm, "full_tensor", None)) else norm).item()
    if math.isfinite(grad_norm) and math.isfinite(step_loss):
        if on_first_step is not None and totals.steps == 0:
            on_first_step()
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        learner.scheduler.step()
        totals.applied(grad_norm, step_loss)
    else:
        totals.skipped += 1
    if scaler is not None:
        scaler.update()  # grows the scale after clean steps, halves it after an overflow
    optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def sync_reference(reference: torch.nn.Module | None, policy: torch.nn.Module, alpha: float) -> None:
    """TR-DPO's soft update, ref <- alpha·policy + (1 − alpha)·ref, parameter by parameter (the
    reference is a copy of the policy's architecture, so names and order match)."""
    if not isinstance(reference, torch.nn.Module):
        raise ValueError("algo.ref_sync needs a reference model of its own (algo.beta > 0, no LoRA)")
    for (name, ref), (policy_name, new) in zip(
        reference.named_parameters(), unwrap(policy).named_parameters(), strict=True
    ):
        if name != policy_name:
            raise ValueError(f"the reference's {name} meets the policy's {policy_name}: not a copy of the policy")
        ref.mul_(1 - alpha).add_(new.to(ref.dtype), alpha=alpha)


def batch_objective(
    learner: Learner,
    batch: UpdateBatch,
    algo: AlgoConfig,
    settings: UpdateSettings,
    epsilons: tuple[float, float] | None,
    totals: UpdateTotals,
) -> Objective:
    """The batch's loss terms with the log-probs they need computed once, before any update: the
    behaviour policy's only when the policy moves before the last update (with a single update
    old = stop_gradient(lp), which costs no extra forward pass), the reference's at β > 0."""
    rollout, micro_size = batch.rollout, max(1, math.ceil(batch.advantages.size(0) / settings.grad_accum_steps))
    old = ref = None
    if algo.num_iterations > 1 or algo.mini_batches > 1:
        sampler = unwrap(learner.model)  # passes without gradients skip the DDP wrapper: nothing to synchronise
        old = logprobs_without_grad(sampler, rollout, micro_size, settings, learner.autocast, totals.entropy)
    if learner.reference is not None:
        ref = logprobs_without_grad(learner.reference, rollout, micro_size, settings, learner.autocast)
    return Objective(algo, epsilons or (algo.epsilon_low, algo.epsilon_high), settings, old, ref)


def sync_when_due(learner: Learner, algo: AlgoConfig) -> None:
    """algo.ref_sync after an applied optimizer step: due at the schedule's positions that are a
    multiple of `every` (this training step's planned start plus its applied steps, so the syncs
    fall where the lr says; a position whose update did not apply syncs nothing)."""
    sync = algo.ref_sync
    if sync.every and learner.scheduler.last_epoch % sync.every == 0:
        sync_reference(learner.reference, learner.model, sync.alpha)


def policy_update(
    learner: Learner,
    batch: UpdateBatch,
    algo: AlgoConfig,
    settings: UpdateSettings,
    epsilons: tuple[float, float] | None = None,
    on_first_step: Callable[[], None] | None = None,
    on_micro_batch: Callable[[int, int], None] | None = None,
    entropy_control: AdaptiveEntropy | None = None,
) -> UpdateStats:
    """Clipped-surrogate (+ β·KL) updates on one rollout batch.

    Loss denominators count `batch.loss_mask`'s tokens and sequences only. `epsilons` (low, high)
    replace `algo.epsilon_*` for this batch (adaptive clipping). `on_first_step` runs just before
    the first optimizer step moves the weights (the trainer's point of no return); `on_micro_batch`
    (k, n) before the k-th of its n micro-batch passes. With fp16's scaler an overflowing step is
    skipped like any non-finite one, and the scaler lowers its scale. `entropy_control`: the run's
    adaptive entropy coefficient (algo.adaptive_entropy), read before each optimizer step and fed
    its kept tokens' mean entropy after; None: algo.entropy_coef, fixed.

    Data-parallel (`learner.collective` over N processes, the model wrapped in
    DistributedDataParallel): each process holds its share of the groups; denominators are summed
    over the processes, and each share's loss is scaled by N because DDP averages gradients, so the
    summed gradient is the one process's gradient on the global batch. Reported figures are global
    sums too, so every process takes the same skip decision and returns the same stats.
    """
    n, g = batch.advantages.size(0), batch.rollout.group_size
    if algo.adaptive_entropy.enabled and entropy_control is None:
        raise ValueError("algo.adaptive_entropy is on: pass the run's AdaptiveEntropy, whose state spans the steps")
    totals = UpdateTotals()
    objective = batch_objective(learner, batch, algo, settings, epsilons, totals)
    next_micro_batch = micro_batch_progress(on_micro_batch, n // g, g, algo, settings.grad_accum_steps)
    for _ in range(algo.num_iterations):
        for rows in plan_mini_batches(n // g, g, algo.mini_batches):
            rows = rows.to(batch.advantages.device)
            micro_batches = rows.tensor_split(min(settings.grad_accum_steps, rows.numel()))
            normalizer, micro_tokens = step_normalizer(
                batch.loss_mask, rows, micro_batches, algo.loss_type, settings.max_new_tokens, learner.collective
            )
            selection = step_entropy_selection(learner, batch, objective, micro_batches)
            coef = entropy_control.coefficient() if entropy_control is not None else algo.entropy_coef
            step_loss, kept = 0.0, torch.zeros(2, dtype=torch.float64)
            for micro, tokens in zip(micro_batches, micro_tokens):
                next_micro_batch()
                sums = micro_step(learner, batch, objective, micro, normalizer, tokens, selection, coef)
                totals.add(sums)
                step_loss += sums.loss
                kept += torch.tensor([sums.kept_entropy, sums.kept_tokens], dtype=torch.float64)
            if entropy_control is not None and entropy_control.enabled:  # every process's kept tokens
                entropy, count = learner.collective.sum(kept).tolist()
                entropy_control.observe(entropy / count if count else math.nan)
            applied = totals.steps
            apply_step(learner, step_loss, settings.max_grad_norm, totals, on_first_step)
            if totals.steps > applied:
                sync_when_due(learner, algo)
    return totals.stats(learner.collective, with_kl=objective.ref_logps is not None)
