"""What a finished step hands to whoever watches the run, and the one method a watcher implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# What the step under way is doing, while it does it: (stage, done, total), e.g. ("sampling", 120,
# 512) tokens, ("training", 3, 8) micro-batches, ("scoring", 0, 0). The trainer calls one; the
# console shows the latest (a real model's first step takes minutes).
StageReport = Callable[[str, int, int], None]


def ignore_stage(stage: str, done: int = 0, total: int = 0) -> None:
    """The StageReport of a trainer nobody watches."""


@dataclass
class StepResult:
    step: int
    metrics: dict[str, Any]  # scalars (and a few strings, e.g. the sandbox backend): one metrics.jsonl line
    samples: list[dict[str, Any]] = field(default_factory=list)  # prompt, completion, rewards, advantage
    alerts: list[str] = field(default_factory=list)  # events a user must see (a reward function masked)
    rewards: dict[str, list[float]] = field(default_factory=dict)  # each function's raw reward per completion
    fused: list[float] = field(default_factory=list)  # the fused reward per completion (NaN: unscorable)
    events: list[str] = field(default_factory=list)  # what changed on purpose (a curriculum phase begins)


class Observer(Protocol):
    """Watches finished steps (metrics file, completion log, console, trackers). An observer
    never changes training; the step counts as finished only once every observer has run."""

    def on_step(self, result: StepResult) -> None: ...


def reward_function_names(row: dict[str, Any]) -> list[str]:
    """The reward functions of a metrics row, in their configured order: each has `reward/<fn>/mean`.

    >>> reward_function_names({"reward/mean": 0.5, "reward/fmt/mean": 1.0, "eval/reward/fmt/mean": 1.0})
    ['fmt']
    """
    parts = [key.split("/") for key in row]
    return [p[1] for p in parts if len(p) == 3 and p[0] == "reward" and p[2] == "mean"]


def completions_due(step: int, every: int) -> bool:
    """Whether a step's completions are logged (`monitor.log_completions_every`): every `every`
    steps and the first, so that a run shorter than `every` still keeps what it sampled; 0: never.

    >>> [step for step in range(1, 25) if completions_due(step, 10)], completions_due(1, 0)
    ([1, 10, 20], False)
    """
    return bool(every) and (step == 1 or step % every == 0)
