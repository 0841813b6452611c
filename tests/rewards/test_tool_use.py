"""tool_call: the reward for a tool call that worked, read from what the environment counted."""

from __future__ import annotations

import pytest

from grpo_cli.environments.builtin import CalculatorEnvironment
from grpo_cli.rewards.builtin import BUILTIN_REWARDS

GOOD = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "364 * 707"}}\n</tool_call>'
NOT_JSON = '<tool_call>\n{"name": "calculate", "arguments": {"expression": 364 * 707}}\n</tool_call>'
UNCLOSED = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "364 * 707"}}'


def trajectory(*turns: str) -> dict:
    """The columns the real calculator environment reports after these model turns."""
    env = CalculatorEnvironment()
    env.reset({"prompt": "What is 364 * 707?", "answer": "257348"})
    for turn in turns:
        if env.step(turn) is None:
            break
    return env.columns()


def score(rows: list[dict], **kwargs: float) -> list[float | None]:
    columns = {key: [row[key] for row in rows] for key in ("env_tool_calls", "env_tool_errors")}
    return BUILTIN_REWARDS["tool_call"](["q"] * len(rows), ["a"] * len(rows), **columns, **kwargs)


def test_a_call_that_worked_scores_one_and_no_call_zero() -> None:
    rows = [trajectory(GOOD, "257348"), trajectory("257348"), trajectory(UNCLOSED)]
    assert score(rows) == [1.0, 0.0, 0.0]  # an unclosed <tool_call> never ran: not a call


def test_a_failed_call_earns_only_the_failed_credit() -> None:
    failed, retried = trajectory(NOT_JSON, "0"), trajectory(NOT_JSON, GOOD, "257348")
    assert failed == {"env_tool_calls": 1, "env_tool_errors": 1}
    assert score([failed, retried]) == [0.0, 1.0]  # one call that worked is enough
    assert score([failed, retried], failed=0.25) == [0.25, 1.0]


def test_a_run_without_an_environment_is_unscored_and_a_bad_credit_refused() -> None:
    assert score([{"env_tool_calls": None, "env_tool_errors": None}]) == [None]
    with pytest.raises(ValueError, match="failed"):
        score([trajectory(GOOD)], failed=1.5)
