"""env=code_feedback: what comes back to the model after a failed answer is what a developer would
want to read (the failing test, the exception with the answer's own lines, the value returned,
what it printed, a program's stderr), and a passing answer ends the trajectory. Runs the real
sandbox through the environment's own `reset`/`step`, as the episode generator calls them."""

from __future__ import annotations

import pytest

from grpo_cli.config.schema import EnvConfig, SandboxConfig
from grpo_cli.environments import load_environment

CHECK = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"


def environment():
    spec = load_environment(EnvConfig(name="code_feedback"), SandboxConfig(timeout_s=10.0))
    return spec.new()


def answer(code: str) -> str:
    return f"```python\n{code}```"


def test_an_exception_comes_back_with_the_failing_assert_the_answers_lines_and_its_output() -> None:
    env = environment()
    env.reset({"prompt": "def double(x):\n", "entry_point": "double", "test": CHECK})
    code = "def helper(x):\n    return x / 0\n\ndef double(x):\n    print('doubling', x)\n    return helper(x)\n"
    feedback = env.step(answer(code))
    assert feedback is not None
    assert "passed 0 of 2 tests" in feedback
    assert "The first failing test: assert candidate(2) == 4" in feedback
    assert "ZeroDivisionError" in feedback
    assert "in helper: return x / 0" in feedback and "in double: return helper(x)" in feedback
    assert "doubling 2" in feedback
    assert env.columns() == {"env_turn_scores": [0.0]}


def test_a_wrong_value_is_shown_beside_the_assert_and_a_right_answer_ends_the_episode() -> None:
    env = environment()
    asserts = ["assert add(2, 3) == 5", "assert add(1, 1) == 2"]
    env.reset({"prompt": "Write add(a, b).", "entry_point": "add", "test_list": asserts})
    feedback = env.step(answer("def add(a, b):\n    return a * b + 1\n"))
    assert feedback is not None and "passed 1 of 2 tests" in feedback  # 1 * 1 + 1 == 2
    assert "The first failing test: assert add(2, 3) == 5" in feedback
    assert "Your function returned: 7" in feedback
    assert env.step(answer("def add(a, b):\n    return a + b\n")) is None
    assert env.columns() == {"env_turn_scores": [0.5, 1.0]}


def test_a_crashing_program_comes_back_with_its_input_output_and_traceback() -> None:
    env = environment()
    env.reset({"prompt": "Read two numbers, print their sum.", "io": [{"input": "1 2\n", "output": "3\n"}]})
    feedback = env.step(answer("a, b = input().split()\nprint(int(a) + int(b) + undefined_name)\n"))
    assert feedback is not None
    assert "input '1 2\\n', expected output '3\\n'" in feedback
    assert "NameError" in feedback and "undefined_name" in feedback


@pytest.mark.parametrize("code", ["def double(x):\n    return (\n", ""])
def test_code_that_does_not_compile_or_is_missing_is_named(code: str) -> None:
    env = environment()
    env.reset({"prompt": "def double(x):\n", "entry_point": "double", "test": CHECK})
    feedback = env.step(answer(code) if code else "")
    assert feedback is not None
    assert ("SyntaxError" in feedback) if code else ("no code" in feedback)
