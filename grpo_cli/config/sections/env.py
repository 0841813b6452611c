"""`env.*`: multi-turn rollouts' environments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENVIRONMENTS = ("none", "custom", "trl", "tools", "code_feedback", "calculator")  # env.name


@dataclass
class EnvConfig:
    """`env.*`: multi-turn rollouts, where an environment answers each model turn (docs/environments.md)."""

    name: str = "none"  # ENVIRONMENTS; none: one model turn per completion
    target: str | None = None  # custom | trl: the environment class, "module:Class"
    tools: list[str] = field(default_factory=list)  # tools: the tool functions, "module:function" each
    kwargs: dict[str, Any] = field(default_factory=dict)  # custom: keyword arguments of the class
    max_turns: int = 3  # model turns per trajectory, the first included (TRL's max_tool_calling_iterations + 1)
    max_tokens: int = 0  # a trajectory's tokens after the prompt, environment's included; 0: what max_turns allow
    max_observation_tokens: int = 256  # tokens kept of one environment answer (its start); the rest is cut
    timeout_s: float = 30.0  # each environment call (reset, step, reward); past it the row fails, the run goes on
