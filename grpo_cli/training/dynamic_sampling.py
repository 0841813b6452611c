"""DAPO's dynamic sampling, `algo.dynamic_sampling` (Yu et al. 2025, arXiv:2503.14476, §3.3).

A group whose fused rewards are all equal gets advantage 0 on every completion: it teaches
nothing, yet it still counts in the loss's denominators and shrinks the step's effective batch.
With dynamic sampling a step drops such groups and draws `train.prompts_per_step` more prompts
from the same seeded PromptSampler, generating and scoring them, until `prompts_per_step` groups
carry a signal or `max_draws` generation rounds (the first included) have run. Signal groups
beyond `prompts_per_step` are discarded, as verl's `filter_groups` does. Short after the last
round, the step trains on the signal groups it has; with none, its update is skipped. Both raise
an alert, and every step logs `sampling/*` (`sampling_metrics`).

Scoring: each completion is scored once (a reward function may be a code sandbox). Which groups
are constant is read from a read-only fusion of each draw (`update_state=False`: the fusion's
running state as the step started). The fusion's running state (zscore EMA statistics, failure
counts, masks) is then updated once per step, by the batch the step reports: the kept groups,
or, when the update is skipped, the last draw (so a function failing on every draw is still
counted, masked, and ends the run with NoRewardLeft instead of skipping steps forever). A kept
group the final fusion finds constant after all (only where several functions' normalised values
cancel exactly, or a function is masked by this very batch) trains with advantage 0, as in GRPO.

Data parallel: every process draws the same global prompts, generates and scores its own share,
and gathers the global raw scores and rollout; the decision is taken on them, so it is the same
everywhere. The kept groups are a multiple of the process count (surplus signal groups are
discarded) and each process trains on its contiguous share of them, whichever process generated
them. Fewer signal groups than processes skip the update.

State: none of its own. The sampler and the RNGs are in TrainState, so a Ctrl-C in the middle
of a refill rolls the step back to its start and a resume replays the refill exactly.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_cli.config.schema import AlgoConfig, TrainConfig
from grpo_cli.core.advantages import zero_spread_groups
from grpo_cli.data import PromptSampler
from grpo_cli.rewards import (
    BatchScores,
    FusionResult,
    RewardExecutor,
    RewardFusion,
    concat_scores,
)
from grpo_cli.rollout import Generator, Rollout
from grpo_cli.rollout.base import concat_rollouts
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.stats import nanmean
from grpo_cli.training.distributed import World
from grpo_cli.training.pipeline import generate_groups, score_rows


@dataclass
class ScoredBatch:
    """What a step trains on, however it was sampled: the plain step builds one from its single
    draw, dynamic sampling from the groups it kept."""

    examples: list[dict[str, Any]]  # the global batch's prompts, in group order
    rollout: Rollout  # this process's share of the groups (world.share(examples)), on the device
    fusion: FusionResult  # the global batch, fused; the fusion's running state has seen it
    timings: dict[str, float]  # seconds: generate, score
    # every group generated this step (several draws under dynamic sampling, read-only fusion): the
    # policy's reward figures, which the controllers read; None: the trained batch is all of them
    generated: FusionResult | None = None
    trains: bool = True  # False: no group carries a signal and the update is skipped
    metrics: dict[str, float] = field(default_factory=dict)  # sampling/*
    alerts: list[str] = field(default_factory=list)


@dataclass
class Draw:
    """One generation round, global: every process holds the same one."""

    examples: list[dict[str, Any]]
    rollout: Rollout  # every process's completions (gathered; this process's own in a single process)
    scores: dict[str, BatchScores]  # raw, per reward function
    signal: list[bool]  # per group


def has_signal(fused: list[float], group_size: int) -> list[bool]:
    """Per group: do its scorable fused rewards differ? `group_advantages`' own test, on the
    float32 tensor the trainer hands it, so a kept group never trains with advantages of 0.

    >>> has_signal([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")], 2)
    [False, True, False, False]
    """
    return (~zero_spread_groups(torch.tensor(fused, dtype=torch.float32), group_size)).tolist()


def keep_count(signal: int, wanted: int, processes: int) -> int:
    """Signal groups to train on: at most `wanted` (train.prompts_per_step, a multiple of the
    process count), rounded down to a multiple of the processes so each trains on an equal share.

    >>> keep_count(7, 4, 1), keep_count(3, 4, 1), keep_count(3, 4, 2), keep_count(1, 4, 2)
    (4, 3, 2, 0)
    """
    return min(signal, wanted) // processes * processes


def fit_mini_batches(algo: AlgoConfig, groups: int) -> AlgoConfig:
    """`algo` for a batch of `groups` groups per process: a short batch (dynamic sampling) cannot
    hold `algo.mini_batches` mini-batches of whole groups, so it takes one mini-batch per group."""
    if 1 <= groups < algo.mini_batches:
        return dataclasses.replace(algo, mini_batches=groups)
    return algo


def select_scores(scores: dict[str, BatchScores], rows: list[int]) -> dict[str, BatchScores]:
    """These rows of a batch's raw scores, renumbered, every field carried (a field left behind is
    a failure forgotten: without env_failed, an environment outage under dynamic sampling was blamed
    on the reward functions); a function's batch error stays with them.

    >>> scores = {"f": BatchScores([1.0, 2.0, 3.0], row_errors={2: "boom"}, env_failed={0: "down"})}
    >>> kept = select_scores(scores, [2, 0])
    >>> kept["f"].row_errors, kept["f"].env_failed
    ({0: 'boom'}, {1: 'down'})
    """
    where = {row: i for i, row in enumerate(rows)}
    return {
        name: BatchScores(
            [s.values[row] for row in rows],
            s.error,
            s.elapsed_s,
            {where[row]: error for row, error in s.row_errors.items() if row in where},
            {column: [where[row] for row in missing if row in where] for column, missing in s.missing.items()},
            s.non_numeric,
            s.logged,
            {column: [values[row] for row in rows] for column, values in s.extra.items()},
            {where[row]: why for row, why in s.env_failed.items() if row in where},
        )
        for name, s in scores.items()
    }


def rows_of(groups: list[int], group_size: int) -> list[int]:
    return [group * group_size + k for group in groups for k in range(group_size)]


def on_device(rollout: Rollout, device: torch.device) -> Rollout:
    """A gathered rollout (CPU tensors) back where this process trains."""
    return Rollout(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in vars(rollout).items()})


def sampling_metrics(draws: list[Draw], kept: int) -> dict[str, float]:
    """The `sampling/*` figures of a step (global counts of groups, i.e. prompts):

    draws           generation rounds this step (verl's num_gen_batches)
    groups_dropped  constant groups (every scorable reward equal) dropped
    groups_excess   signal groups discarded: beyond train.prompts_per_step, or not splitting evenly
                    over the data-parallel processes
    groups_kept     groups trained on (0: the update was skipped)
    signal_frac     share of the generated groups that carried a signal (1 - TRL's frac_reward_zero_std
                    before filtering)
    kept_frac       share of the generated groups trained on: what the step's generation bought
    """
    generated = sum(len(d.signal) for d in draws)
    signal = sum(sum(d.signal) for d in draws)
    return {
        "sampling/draws": len(draws),
        "sampling/groups_generated": generated,
        "sampling/groups_dropped": generated - signal,
        "sampling/groups_excess": signal - kept,
        "sampling/groups_kept": kept,
        "sampling/signal_frac": signal / generated,
        "sampling/kept_frac": kept / generated,
    }


class DynamicSampler:
    """The refill loop: draw, generate, score and judge rounds until the step is full, then fuse
    the kept groups once. One `fill()` per step, called by GRPOTrainer.step()."""

    def __init__(
        self,
        cfg: TrainConfig,
        sampler: PromptSampler,
        encoder: PromptEncoder,
        generator: Generator,
        executor: RewardExecutor,
        fusion: RewardFusion,
        world: World,
        pad_token_id: int,
    ) -> None:
        self.max_draws, self.wanted = cfg.algo.dynamic_sampling.max_draws, cfg.train.prompts_per_step
        self.group_size, self.mini_batches = cfg.rollout.num_generations, cfg.algo.mini_batches
        self.sampler, self.encoder, self.generator = sampler, encoder, generator
        self.executor, self.fusion, self.world, self.pad_token_id = executor, fusion, world, pad_token_id

    def fill(self, weights: dict[str, float]) -> ScoredBatch:
        """Rounds until `prompts_per_step` groups carry a signal or `max_draws` have run; `weights`:
        the step's reward weights (curriculum), for judging and for the final fusion alike."""
        draws: list[Draw] = []
        timings = {"generate": 0.0, "score": 0.0}
        while len(draws) < self.max_draws and sum(sum(d.signal) for d in draws) < self.wanted:
            draws.append(self.draw(weights, timings))
        signal = [(i, group) for i, d in enumerate(draws) for group, s in enumerate(d.signal) if s]
        kept = keep_count(len(signal), self.wanted, self.world.size)
        t0 = time.perf_counter()
        if kept:
            picks = signal[:kept]
            by_draw = [(d, [group for i, group in picks if i == n]) for n, d in enumerate(draws)]
            by_draw = [(d, groups) for d, groups in by_draw if groups]
        else:  # the update is skipped: the step reports (and the fusion's state sees) its last draw
            by_draw = [(draws[-1], list(range(len(draws[-1].signal))))]
        examples = [d.examples[group] for d, groups in by_draw for group in groups]
        rollout = concat_rollouts([self.rows(d.rollout, groups) for d, groups in by_draw], self.pad_token_id)
        scores = concat_scores([select_scores(d.scores, rows_of(groups, self.group_size)) for d, groups in by_draw])
        fusion = self.fusion.fuse(scores, self.group_size, weights)
        # the policy's figures: every draw, fused read-only (the kept groups alone pull a binary reward to 0.5)
        generated = self.fusion.fuse(concat_scores([d.scores for d in draws]), self.group_size, weights, False)
        timings["score"] += time.perf_counter() - t0
        share = len(examples) // self.world.size
        mine = self.rows(rollout, list(range(self.world.rank * share, (self.world.rank + 1) * share)))
        return ScoredBatch(
            examples,
            on_device(mine, self.encoder.device),
            fusion,
            timings,
            generated,
            trains=kept > 0,
            metrics={**sampling_metrics(draws, kept), "sampling/kept_reward_mean": nanmean(fusion.raw)},
            alerts=self.alerts(len(draws), len(signal), kept),
        )

    def draw(self, weights: dict[str, float], timings: dict[str, float]) -> Draw:
        """One round: `prompts_per_step` global prompts, this process's share generated and scored,
        the global scores and rollout gathered, each group judged on the fusion's current state."""
        t0 = time.perf_counter()
        world, g = self.world, self.group_size
        examples = self.sampler.next_batch(self.wanted)  # the same global prompts in every process
        mine = world.share(examples)
        rollout = generate_groups(mine, self.encoder, self.generator, g)
        t1 = time.perf_counter()
        scores = score_rows(mine, rollout, self.executor, self.fusion, world.gather_scores if world.size > 1 else None)
        judged = self.fusion.fuse(scores, g, weights, update_state=False)  # the running state is left alone
        t2 = time.perf_counter()
        rollout = world.gather_rollout(rollout, self.pad_token_id)  # any process may train on any group
        timings["generate"] += t1 - t0 + time.perf_counter() - t2
        timings["score"] += t2 - t1
        return Draw(examples, rollout, scores, has_signal(judged.fused, g))

    def rows(self, rollout: Rollout, groups: list[int]) -> Rollout:
        rows = torch.tensor(rows_of(groups, self.group_size), dtype=torch.long, device=rollout.completion_ids.device)
        return rollout.select(rows, self.group_size)

    def alerts(self, draws: int, signal: int, kept: int) -> list[str]:
        """Why a step trains on fewer than train.prompts_per_step groups, if it does."""
        if kept == self.wanted:
            return []
        found = (
            f"dynamic sampling: {signal} group(s) with a signal after {draws} draw(s) of {self.wanted} prompts "
            f"(algo.dynamic_sampling.max_draws={self.max_draws})"
        )
        if kept == 0 and signal:
            return [f"{found}: update skipped, as they do not split over the {self.world.size} processes"]
        if kept == 0:
            return [
                f"{found}: update skipped; every reward was equal within its group, so the task may be too easy "
                "or too hard for the policy, or a reward function fails"
            ]
        split = f" (a multiple of the {self.world.size} processes)" if kept < min(signal, self.wanted) else ""
        alerts = [f"{found}: training on {kept}{split} of train.prompts_per_step={self.wanted}"]
        per_process = kept // self.world.size
        if per_process < self.mini_batches:
            alerts.append(
                f"algo.mini_batches={self.mini_batches} > {per_process} group(s) per process: "
                f"{per_process} mini-batch(es) this step"
            )
        return alerts
