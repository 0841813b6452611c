"""What a finished step hands to whoever watches the run, and the one method a watcher implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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
