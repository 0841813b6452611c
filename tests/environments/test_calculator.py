"""env=calculator: the tool answers what the model asks, and no expression can hold the trainer.

Issue 52 item 5: each exponent was bounded, the value was not: `(((10**64)**64)**64)**64` held the
GIL 20.6 s with env.timeout_s=1 (the deadline's own thread cannot run while an int operation holds
the GIL). Every operation's result size is now bounded before it is computed, so no expression the
model writes costs more than a few microseconds per operator, and the deadline never has to act."""

from __future__ import annotations

import json
import time

import pytest

from grpo_cli.bounded_calls import call_all
from grpo_cli.config.schema import EnvConfig, SandboxConfig
from grpo_cli.environments import load_environment
from grpo_cli.environments.builtin import MAX_RESULT_BITS, calculate


def tool_call(expression: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'calculate', 'arguments': {'expression': expression}})}</tool_call>"


@pytest.mark.parametrize(
    "expression",
    [
        "(((10**64)**64)**64)**64",  # the issue's: 20.6 s of GIL, then a ValueError from str()
        "9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64 * 9**64",
        "-(2**64)**17",
    ],
)
def test_a_result_over_the_bound_is_refused_before_it_is_computed(expression: str) -> None:
    spec = load_environment(EnvConfig(name="calculator"), SandboxConfig())
    env = spec.new()
    env.reset({"prompt": "?"})
    started = time.perf_counter()
    [(observation, why)] = call_all([lambda: env.step(tool_call(expression))], timeout_s=EnvConfig().timeout_s)
    # the real guarantee is the message (refused before computing); the clock only catches a
    # regression that computes first (20 s and more here) with a margin no loaded machine erodes
    assert time.perf_counter() - started < EnvConfig().timeout_s
    assert why is None
    assert observation == [
        {"role": "tool", "name": "calculate", "content": observation[0]["content"]},
    ]
    assert observation[0]["content"].startswith("error: ValueError: the result would be over")
    assert f"{MAX_RESULT_BITS} bits" in observation[0]["content"]
    assert env.columns() == {"env_tool_calls": 1, "env_tool_errors": 1}


def test_results_within_the_bound_are_exact() -> None:
    assert calculate("(3 + 4) * 2") == "14"
    assert calculate("(2**64)**15 - 1") == str(2**960 - 1)  # 290 digits: big, but within the bound
    assert calculate("(10**64)**4 // (10**63)**4") == "10000"
    assert calculate("0**64 + 1**64 + (-1)**63") == "0"
    assert calculate("2.5 ** 3") == "15.625"
    with pytest.raises(ValueError, match="exponent 65 is over 64"):
        calculate("2 ** 65")
