"""The registry of built-in rewards: the names a config's `target:` may use without an import path.

Each is a plain function `f(prompts, completions, **columns) -> list[float | None]` with a
doctest; None marks a sample the function cannot score (the fusion treats it as NaN).
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_cli.rewards.answers import answer_partial_credit, exact_match, last_number
from grpo_cli.rewards.code.sandboxed_rewards import code_efficiency, code_tests
from grpo_cli.rewards.code.static_rewards import code_compiles, code_similarity, code_style
from grpo_cli.rewards.environment import code_feedback_final, code_feedback_improvement, env_reward
from grpo_cli.rewards.math_answer import math_answer
from grpo_cli.rewards.structure import overlong, repetition, think_answer_format
from grpo_cli.rewards.tool_use import tool_call

__all__ = [
    "BUILTIN_REWARDS",
    "answer_partial_credit",
    "code_compiles",
    "code_efficiency",
    "code_similarity",
    "code_style",
    "code_tests",
    "exact_match",
    "last_number",
    "math_answer",
    "overlong",
    "repetition",
    "think_answer_format",
    "tool_call",
]

BUILTIN_REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "exact_match": exact_match,
    "answer_partial_credit": answer_partial_credit,
    "last_number": last_number,
    "math": math_answer,
    "format": think_answer_format,
    "overlong": overlong,
    "repetition": repetition,
    # Code (docs/architecture.md §3, §5). Importing them is cheap: the sandbox starts on code_tests' first call.
    "code_compiles": code_compiles,
    "code_tests": code_tests,
    "code_style": code_style,
    "code_similarity": code_similarity,
    "code_efficiency": code_efficiency,  # bytecode instructions against the reference's; weight 0 in reward=code
    # Multi-turn rollouts (env.*): what the environment reported
    "env_reward": env_reward,
    "code_feedback_final": code_feedback_final,
    "code_feedback_improvement": code_feedback_improvement,
    "tool_call": tool_call,  # a call that ran (env_tool_calls, env_tool_errors): recipes/smollm2_135m_tool_use.yaml
}
