"""A reward for calling a tool, read from what a tool environment counted (env=calculator, env=tools,
env=trl: the `env_tool_calls` and `env_tool_errors` columns).

A model that never calls its tool gives GRPO no call to reward: the answer reward alone teaches a
small model to guess (docs/benchmarks.md, "Learning to call a tool"). Beside the answer reward, a
call that ran earns credit of its own, so a group with one working call pulls the others towards it."""

from __future__ import annotations

from typing import Any

from grpo_cli.rewards.rows import score_each


def tool_call(
    prompts: list[Any],
    completions: list[str],
    env_tool_calls: list[Any],
    env_tool_errors: list[Any],
    failed: float = 0.0,
    **_: Any,
) -> list[float | None]:
    """1 when the trajectory made a tool call that ran (at least one of its calls returned no error),
    `failed` when every call it made failed (not JSON, an unknown tool, the tool raised), 0 with no
    call; None for a row no tool environment counted. `failed` in [0, 1]: a little credit for trying,
    for a model whose first calls are all malformed.

    >>> tool_call(["q"] * 4, ["a"] * 4, env_tool_calls=[2, 1, 0, None], env_tool_errors=[1, 1, 0, None])
    [1.0, 0.0, 0.0, None]
    >>> tool_call(["q"], ["a"], env_tool_calls=[1], env_tool_errors=[1], failed=0.25)
    [0.25]
    """
    if not 0.0 <= failed <= 1.0:
        raise ValueError(f"tool_call: failed must be in [0, 1], got {failed}")

    def credit(calls: Any, errors: Any) -> float | None:
        if calls is None:
            return None
        if calls == 0:
            return 0.0
        return 1.0 if calls > (errors or 0) else float(failed)

    return score_each(credit, env_tool_calls, env_tool_errors)
