"""`env.*`: multi-turn rollouts' environments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENVIRONMENTS = ("none", "custom", "trl", "tools", "code_feedback", "calculator", "agent")  # env.name
# env.token_mode: how a later model turn's context is built (docs/environments.md, "Token modes")
TOKEN_MODES = ("append", "fork", "per_turn")


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
    timeout_s: float = 30.0  # each environment call (reset, step, reward; agent: the episode); past it the row fails
    # TOKEN_MODES. append: the sampled ids kept, only what the environment adds tokenized; fork: the
    # conversation re-rendered by the chat template each turn, a new training row where it does not extend
    # the tokens so far; per_turn: each model turn its own row, with the episode's advantage
    token_mode: str = "append"
    agent: str | None = None  # agent: the harness, "FILE.py:FUNCTION" or "module:function", run(base_url, api_key, row)
    command: str | None = None  # agent: a harness that is not Python, a command run once per episode
    request_timeout_s: float = 120.0  # agent: one request to the endpoint, queued and sampled; past it an HTTP error
