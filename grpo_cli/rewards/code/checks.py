"""From a dataset's tests to the checks the parent runs: HumanEval's `check(candidate)` split into
units, MBPP's assert strings as (call, expected) pairs or rewritten asserts, the set-up code, stdout
lines; and `strict_equal`, what `==` means in every shape (docs/architecture.md §5). Nothing here runs
candidate code: `CallCase` and `ExprCase` are plain descriptions the judge (`judge.py`) evaluates.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from grpo_cli.rewards.code.tasks import parse_source

# Names the rewritten test code calls; bound by the parent in the namespace it runs tests in.
TALLY = "__grpo_tally__"  # a UnitTally: `unit(passed)` at the end of each unit
EQUAL = "__grpo_equal__"  # strict_equal: what `==` means in every test shape
REMOTE = "__grpo_remote__"  # a call of the entry point evaluated in the sandbox, given as source


class UnitTally:
    """Counts test units, and only those that exercise the candidate.

    The candidate proxy calls `called()` on every call; a unit ends with `unit(passed)`. A unit
    during which (or in the set-up statements since the previous unit) the candidate was never
    called is idle: `assert True, "..."` lines and asserts on the test's own helpers are not
    units, so a forged or empty completion cannot collect them.

    `passed_units` are the positions (in test order, idle ones included) of the units passed,
    so two programs' verdicts on one task can be compared unit by unit.

    >>> tally = UnitTally()
    >>> tally.called(); tally.unit(True); tally.unit(True); tally.called(); tally.unit(False)
    >>> tally.passed, tally.idle, tally.calls, tally.passed_units
    (1, 1, 2, {0})
    """

    def __init__(self) -> None:
        self.calls = 0
        self.passed = 0
        self.idle = 0
        self.passed_units: set[int] = set()
        self.first_failed: int | None = None  # the position of the first unit failed (idle ones are not)
        self._mark = 0
        self._units = 0

    @property
    def position(self) -> int:
        """The position of the unit running now."""
        return self._units

    def called(self) -> None:
        self.calls += 1

    def unit(self, passed: bool) -> None:
        if self.calls == self._mark:
            self.idle += 1
        elif passed:
            self.passed += 1
            self.passed_units.add(self._units)
        elif self.first_failed is None:
            self.first_failed = self._units
        self._mark = self.calls
        self._units += 1


def strict_equal(got: Any, expected: Any) -> bool:
    """What `==` means in every test shape (a `check()`, an MBPP assert, a (call, expected) pair):
    bool only equals bool (`1 == True` fails), a list never equals a tuple, containers compare
    element by element, int and float compare by value, floats within a relative tolerance of
    1e-9 or an absolute one of 1e-12 (summation order differs between correct solutions).

    >>> strict_equal(1, True), strict_equal(1, 1.0), strict_equal(True, 1.0), strict_equal([1, 2], (1, 2))
    (False, True, False, False)
    >>> strict_equal(0.1 + 0.2, 0.3), strict_equal(0.1 + 0.2 - 0.3, 0.0), strict_equal(1.0, 1.0001)
    (True, True, False)
    >>> strict_equal({"a": [1, (2, "x")]}, {"a": [1, (2, "x")]})
    True
    """
    numbers = (int, float)
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if type(got) in numbers and type(expected) in numbers:
        if type(got) is int and type(expected) is int:
            return got == expected
        return got == expected or math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    if type(got) is not type(expected):
        sets = (set, frozenset)
        return type(got) in sets and type(expected) in sets and got == expected
    if type(got) in (list, tuple):
        return len(got) == len(expected) and all(strict_equal(a, b) for a, b in zip(got, expected))
    if type(got) is dict:
        return got.keys() == expected.keys() and all(strict_equal(got[k], expected[k]) for k in got)
    return bool(got == expected)  # str, bytes, None, complex, sets, the test's own objects


class _StrictEquality(ast.NodeTransformer):
    """`a == b` -> `EQUAL(a, b)` and `a != b` -> `not EQUAL(a, b)` (a chain keeps Python's `==`)."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        call: ast.expr = ast.Call(ast.Name(EQUAL, ast.Load()), [node.left, node.comparators[0]], [])
        if isinstance(node.ops[0], ast.NotEq):
            call = ast.UnaryOp(ast.Not(), call)
        return ast.copy_location(call, node)


class _RemoteCalls(ast.NodeTransformer):
    """`f(args)` -> `REMOTE("f(args)")` where the arguments name nothing the statement binds
    itself (a comprehension variable): the call is then evaluated in the sandbox, where the set-up
    code's classes exist, so arguments need not be plain values."""

    def __init__(self, entry_point: str, bound: set[str]) -> None:
        self.entry_point = entry_point
        self.bound = bound

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == self.entry_point:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if not names & self.bound:
                return ast.copy_location(
                    ast.Call(ast.Name(REMOTE, ast.Load()), [ast.Constant(ast.unparse(node))], []), node
                )
        self.generic_visit(node)
        return node


def _bound_names(tree: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return names | {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}  # lambda parameters


@dataclass(frozen=True)
class CallCase:
    """`assert f(*args, **kwargs) == expected`: the call goes to the sandbox, the parent compares."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    expected: Any


@dataclass(frozen=True)
class ExprCase:
    """Any other assert: trusted dataset code run in the parent; `source` is the assert as written,
    `code` the same with strict `==` and the entry point's calls sent to the sandbox."""

    source: str
    code: str = ""


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _as_call_case(node: ast.AST, entry_point: str) -> CallCase | None:
    """The (call, expected) pair of `f(literals) == literal` (either side), else None."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
        return None
    for call, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry_point):
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        parsed = [_literal(a) for a in call.args]
        named = {k.arg: _literal(k.value) for k in call.keywords}
        ok, expected = _literal(other)
        if ok and all(p[0] for p in parsed) and all(v[0] for v in named.values()):
            return CallCase(tuple(p[1] for p in parsed), {k: v[1] for k, v in named.items()}, expected)
    return None


def _expr_case(text: str, tree: ast.Module, entry_point: str) -> ExprCase:
    # calls first: a call sent to the sandbox as source must not name the parent-side `==`
    tree = _StrictEquality().visit(_RemoteCalls(entry_point, _bound_names(tree)).visit(tree))
    return ExprCase(text, ast.unparse(ast.fix_missing_locations(tree)))


def parse_test_list(asserts: list[str] | tuple[str, ...], entry_point: str) -> list[CallCase | ExprCase]:
    """MBPP-style assert strings, one case each: a (call, expected) pair where the assert is
    `f(literals) == literal`, else the assert to run in the parent, its `==` strict and its calls
    of `f` evaluated in the sandbox.

    >>> parse_test_list(["assert add(2, 3) == 5", "assert add(b=1, a=1) == 2"], "add")
    [CallCase(args=(2, 3), kwargs={}, expected=5), CallCase(args=(), kwargs={'b': 1, 'a': 1}, expected=2)]
    >>> parse_test_list(["assert abs(mean([1, 2]) - 1.5) < 1e-9"], "mean")[0].code
    "assert abs(__grpo_remote__('mean([1, 2])') - 1.5) < 1e-09"
    >>> parse_test_list(["assert all(sq(x) == x * x for x in range(3))"], "sq")[0].code
    'assert all((__grpo_equal__(sq(x), x * x) for x in range(3)))'
    """
    return list(_test_list_cases(tuple(map(str, asserts)), entry_point))


@lru_cache(maxsize=1024)
def _test_list_cases(asserts: tuple[str, ...], entry_point: str) -> tuple[CallCase | ExprCase, ...]:
    cases: list[CallCase | ExprCase] = []
    for text in asserts:
        text = text.strip()
        tree = parse_source(text)
        if tree is None:
            cases.append(ExprCase(text, text))  # still counted: it fails when run, as it would under MBPP
            continue
        node = tree.body[0] if len(tree.body) == 1 else None
        case = _as_call_case(node.test, entry_point) if isinstance(node, ast.Assert) else None
        cases.append(case or _expr_case(text, tree, entry_point))
    return tuple(cases)


def _calls_check(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "check"
    )


@lru_cache(maxsize=1024)
def check_units(test_source: str) -> tuple[str, int]:
    """HumanEval's `check(candidate)` rewritten so each top-level statement of its body that holds
    an assert is one test unit: a unit that raises counts as failed and the rest still run.

    Returns the rewritten source and the number of unit statements. Each unit ends by calling
    `TALLY.unit(passed)` (see `UnitTally`: one that never called the candidate is idle, not a
    unit), and every `==` is `strict_equal`. Statements without an assert (set-up) run as written;
    if one raises, `check` raises and the units not reached count as failed. A top-level
    `check(...)` call in the source is dropped: the parent calls `check` exactly once.

    >>> source, units = check_units("def check(candidate):\\n    x = 2\\n    assert candidate(x) == 4\\n"
    ...                             "    assert True, 'debug'\\n    assert candidate(0) == 0\\n\\ncheck(f)\\n")
    >>> units
    3
    >>> tally = UnitTally()
    >>> def four(v):
    ...     tally.called()
    ...     return 4
    >>> namespace = {TALLY: tally, EQUAL: strict_equal}
    >>> exec(source, namespace)
    >>> namespace["check"](four)
    >>> tally.passed, tally.idle
    (1, 1)
    """
    tree = ast.parse(test_source)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise ValueError("the `test` source defines no check(candidate) function")
    tree.body = [node for node in tree.body if not _calls_check(node)]
    body: list[ast.stmt] = []
    units = 0
    for stmt in check.body:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            body.append(stmt)
            continue
        units += 1
        body.append(
            ast.Try(
                body=[stmt, ast.parse(f"{TALLY}.unit(True)").body[0]],
                handlers=[
                    ast.ExceptHandler(
                        type=ast.Name("Exception", ast.Load()), name=None, body=ast.parse(f"{TALLY}.unit(False)").body
                    )
                ],
                orelse=[],
                finalbody=[],
            )
        )
    check.body = body or [ast.Pass()]
    tree = _StrictEquality().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)), units


def unit_sources(test_source: str) -> list[str]:
    """The source of each unit `check_units` counts, in its order: what a failing unit was.

    >>> unit_sources("def check(candidate):\\n    x = 2\\n    assert candidate(x) == 4\\n")
    ['assert candidate(x) == 4']
    """
    tree = ast.parse(test_source)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    body = check.body if check is not None else []
    return [ast.unparse(stmt) for stmt in body if any(isinstance(n, ast.Assert) for n in ast.walk(stmt))]


def test_setup(test_setup_code: Any, test_imports: Any) -> str:
    """MBPP's set-up as one source: its `test_imports` lines, then its `test_setup_code`. It runs
    before the candidate's code in the sandbox and before the asserts in the parent.

    >>> test_setup("class Pair:\\n    pass\\n", ["import math"])
    'import math\\nclass Pair:\\n    pass\\n'
    >>> test_setup(None, None), test_setup("", [])
    ('', '')
    """
    imports = "".join(f"{line}\n" for line in (test_imports or []) if str(line).strip())
    return imports + (str(test_setup_code) if test_setup_code else "")


def output_lines(text: str) -> list[str]:
    """Stdout normalised for comparison: each line right-stripped, trailing empty lines dropped.

    >>> output_lines("3 4  \\n5\\r\\n\\n\\n")
    ['3 4', '5']
    """
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
