"""The environments that ship: `env=calculator` (one tool, for the arithmetic data) and
`env=code_feedback` (the sandbox's test results fed back, for the code data)."""

from __future__ import annotations

import ast
import dataclasses
import operator
from typing import Any

from grpo_cli.config.schema import SandboxConfig
from grpo_cli.environments.base import ToolEnvironment

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 64  # a model asking for 9**9**9 gets an error, not a stalled rollout
# Every int the calculator makes stays under 2**MAX_RESULT_BITS (~308 digits, a float's range),
# checked BEFORE each operation: an int operation holds the GIL, so a deadline could not stop it
# ((((10**64)**64)**64)**64 held it 20 s); on operands this size each one takes microseconds.
MAX_RESULT_BITS = 1024


def _result_bits(op: ast.operator, left: float | int, right: float | int) -> int:
    """An upper bound on the bits of `left op right` for two ints, known without computing it;
    0 when a float is involved (a float operation costs the same whatever its value)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return 0
    a, b = left.bit_length(), right.bit_length()
    if isinstance(op, ast.Pow):
        return a * max(right, 0)  # a negative exponent gives a float
    if isinstance(op, ast.Mult):
        return a + b
    return max(a, b) + 1  # + - and the divisions: never more than the larger operand and a carry


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is over {MAX_EXPONENT}")
        if _result_bits(node.op, left, right) > MAX_RESULT_BITS:
            raise ValueError(f"the result would be over {MAX_RESULT_BITS} bits (about 308 digits): not computed")
        value = _OPERATORS[type(node.op)](left, right)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        value = _OPERATORS[type(node.op)](_evaluate(node.operand))
    else:
        raise ValueError(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:  # a literal written that long
        raise ValueError(f"the result would be over {MAX_RESULT_BITS} bits (about 308 digits): not computed")
    return value


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 2".

    Returns:
        The value, as text.
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


class CalculatorEnvironment(ToolEnvironment):
    """`calculate` as the one tool; the answer after the last call is scored by the data's rewards.
    (The tool's docstring is its schema, so its examples live here.)

    >>> calculate("(3 + 4) * 2"), calculate("7 / 2"), calculate("2 ** 3 - 1")
    ('14', '3.5', '7')
    """

    def __init__(self) -> None:
        super().__init__([calculate])


class CodeFeedbackEnvironment:
    """The model answers a code task; the task's tests run in the sandbox after each answer; while
    some fail and turns remain, what failed comes back as the next user message. The reward
    functions see the last answer as the completion, and each answer's score (the share of units
    passed, as `code_tests` with mode=fraction) in the `env_turn_scores` column
    (`code_feedback_final` and `code_feedback_improvement` read it)."""

    def __init__(self, sandbox: SandboxConfig) -> None:
        self.sandbox = sandbox
        self.task: Any = None
        self.turn_scores: list[float | None] = []

    @staticmethod
    def workers(sandbox: SandboxConfig) -> int:
        """Steps run at once: each runs the tests in a sandboxed session, and sessions keep to
        the bound code_tests keeps to (`sandbox.workers`, at most the cores)."""
        from grpo_cli.rewards.code.sandbox import session_workers

        return session_workers(sandbox)

    def reset(self, example: dict[str, Any]) -> str | None:
        from grpo_cli.rewards.code.judge import Task

        self.turn_scores = []
        columns = (example.get(name) for name in ("entry_point", "test", "test_list", "io"))
        self.task = Task.from_row(example["prompt"], *columns, example)
        if not self.task.runnable:
            raise ValueError("env=code_feedback: this row has no tests (test, test_list or io)")
        return None

    def step(self, completion: str) -> str | None:
        score, feedback = self._judge(completion)
        self.turn_scores.append(score)
        return None if score == 1.0 else feedback

    def columns(self) -> dict[str, Any]:
        return {"env_turn_scores": list(self.turn_scores)}

    def _judge(self, completion: str) -> tuple[float | None, str]:
        from grpo_cli.rewards.code.batch import sandbox_for
        from grpo_cli.rewards.code.judge import judge
        from grpo_cli.rewards.code.tasks import strip_fences

        task = self.task
        program = task.program(completion)
        if not strip_fences(completion).strip():
            return 0.0, "Your answer has no code. Answer with the complete function."
        try:
            compile(program, "<answer>", "exec", dont_inherit=True)
        except SyntaxError as err:
            return 0.0, f"Your code does not compile: SyntaxError: {err.msg} (line {err.lineno}). Fix it."
        except (ValueError, MemoryError, RecursionError, OverflowError) as err:
            return 0.0, f"Your code does not compile: {type(err).__name__}. Fix it."
        verdict = judge(sandbox_for(**dataclasses.asdict(self.sandbox)), task, program)
        if verdict is None:  # a harness fault: not the model's doing, and nothing to tell it
            raise RuntimeError("the sandbox failed (a harness fault) while running the tests")
        score = verdict.passed / verdict.units if verdict.units else 0.0
        if verdict.all_passed:
            return 1.0, "All tests passed."
        return score, self._failure_text(verdict)

    def _failure_text(self, verdict: Any) -> str:
        summary = f"Your code passed {verdict.passed} of {verdict.units} tests."
        if verdict.failure:
            summary += f"\n{verdict.failure}"
        elif not verdict.finished:
            summary += " It crashed, timed out or exited before the tests finished."
        return summary + "\nFix the code and answer with the complete function."
