"""What every command's value checks share: the enumerated settings and the one error shape.

Type errors are caught by OmegaConf against the schema; the checks catch what types cannot say
(ranges, enumerations, paths). Each command's own checks live in its `*_checks` module and build
on these, so `invalid value KEY=VALUE: why` reads the same from every command.
"""

from __future__ import annotations

import difflib
import os

from grpo_cli.config.schema import (
    CONSOLES,
    CPU_HEAPS,
    CURRICULA,
    INTERPOLATIONS,
    LAYOUTS,
    LONG_PROMPT_POLICIES,
    LOSS_TYPES,
    LR_SCALINGS,
    ROLLOUT_BACKENDS,
    ROLLOUT_CORRECTIONS,
    ROLLOUT_LOOPS,
    SAMPLING_WEIGHTS,
    DataConfig,
    RewardConfig,
)
from grpo_cli.errors import GrpoError

CHOICES = {
    "model.kind": ("tiny", "hf"),
    "model.dtype": ("auto", "fp32", "bf16", "fp16"),
    "data.kind": ("arithmetic", "jsonl", "math", "code", "hf"),
    "data.on_long_prompt": LONG_PROMPT_POLICIES,
    "precision.dtype": ("fp32", "bf16", "fp16"),
    "guard.action": ("warn", "pause", "stop"),
    "algo.loss_type": LOSS_TYPES,
    "algo.scale_rewards": ("group", "batch", "none"),
    "algo.ratio_level": ("token", "sequence"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "algo.rollout_correction.mode": ROLLOUT_CORRECTIONS,
    "optim.scheduler": ("constant", "cosine", "linear"),
    "optim.lr_scaling": LR_SCALINGS,
    "rollout.backend": ROLLOUT_BACKENDS,
    "rollout.loop": ROLLOUT_LOOPS,
    "rollout.sampling_weights": SAMPLING_WEIGHTS,
    "train.layout": LAYOUTS,
    "train.cpu_heap": CPU_HEAPS,
    "curriculum.name": CURRICULA,
    "curriculum.interpolate": INTERPOLATIONS,
    "reward.aggregation": ("weighted_mean", "normalize_then_sum"),
    "sandbox.backend": ("auto", "bwrap", "unshare", "process"),
    "monitor.console": CONSOLES,
}


def fail(key: str, value: object, why: str) -> None:
    raise GrpoError(f"invalid value {key}={value!r}: {why}")


def check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        fail(key, value, f"must be one of {', '.join(allowed)}{hint}")


def check_at_least_one(values: dict[str, int]) -> None:
    """Counts of things (steps, prompts, workers) keyed by their config key."""
    for key, value in values.items():
        if value < 1:
            fail(key, value, "must be at least 1")


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (taskset, a container's cpuset), which
    torch's threads share."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(key: str, threads: int) -> None:
    """Torch CPU threads: refused above the cores rather than clamped, so the number a config says is
    the number that runs (a recipe from a bigger machine fails in one line, naming the count here);
    more threads than cores contend for them, and a step ran 100x slower without a word."""
    if threads < 0:
        fail(key, threads, "must be >= 0 (torch CPU threads; 0: auto)")
    cores = usable_cores()
    if threads > cores:
        fail(
            key,
            threads,
            f"more than the {cores} CPU core(s) this process may use: threads beyond the cores contend for them "
            f"and every step runs many times slower; set at most {cores}, or 0 (auto)",
        )


def check_split_selects(split: str, data: DataConfig) -> None:
    if split == "eval" and data.eval_fraction == 0:
        raise GrpoError("split=eval selects nothing with data.eval_fraction=0: set data.eval_fraction > 0")


def check_rewards_chosen(reward: RewardConfig) -> None:
    if not reward.functions:
        raise GrpoError("reward.functions is empty: choose a reward, e.g. reward=arithmetic")
