"""Code task formats: from a completion to a program, and from dataset tests to checks the parent runs.

A completion is either a whole program or a function body that continues the prompt; a markdown
fence around it is dropped. Tests come in the public shapes (DESIGN.md §6): `test` (HumanEval's
`check(candidate)`), `test_list` (MBPP's assert strings) and `io` (stdin/stdout pairs). Nothing here
runs candidate code: `CallCase` and `ExprCase` are plain descriptions the reward evaluates.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_SOURCE_CHARS = 100_000  # every cheap check works on at most this much of a completion
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)  # first block; an unclosed one runs to the end


def cap(text: Any, limit: int = MAX_SOURCE_CHARS) -> str:
    """The first `limit` characters of `text` as a string (None becomes "").

    >>> cap("abcdef", 3), cap(None)
    ('abc', '')
    """
    return "" if text is None else str(text)[:limit]


def strip_fences(text: str) -> str:
    """The first fenced code block if the text has one, else the text itself.

    >>> strip_fences("Here you go:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> strip_fences("    return x + 1\\n")
    '    return x + 1\\n'
    """
    text = cap(text)
    match = FENCE.search(text)
    return match.group(1) if match else text


def prompt_text(prompt: Any) -> str:
    """The code a prompt carries: a string as is, or the last user message of a chat prompt,
    with its fenced block taken when it has one.

    >>> prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):\\n"}])
    'def f(x):\\n'
    """
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    return strip_fences(cap(prompt))


def defines_at_top_level(source: str, name: str) -> bool:
    """Whether `source` binds `name` at module level (def, class, assignment or import).

    A function body alone does not parse, so a line-start `def name(` counts as well.

    >>> defines_at_top_level("def add(a, b):\\n    return a + b\\n", "add")
    True
    >>> defines_at_top_level("    return a + b\\n", "add")
    False
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return re.search(rf"^(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
    return False


def assemble_program(prompt: Any, completion: Any, entry_point: str | None) -> str:
    """The program to judge: the fence-stripped completion, after the prompt's code when the
    completion does not define `entry_point` itself (it is then the body the prompt opened).

    Stdin/stdout tasks (no entry point) take the completion as the whole program.

    >>> prompt = 'def double(x):\\n    \"\"\"Twice x.\"\"\"\\n'
    >>> print(assemble_program(prompt, "```python\\n    return 2 * x\\n```", "double"), end="")
    def double(x):
        \"\"\"Twice x.\"\"\"
        return 2 * x
    >>> assemble_program(prompt, "def double(x):\\n    return x + x\\n", "double")
    'def double(x):\\n    return x + x\\n'
    """
    code = strip_fences(completion)
    if not entry_point or defines_at_top_level(code, entry_point):
        return code
    head = prompt_text(prompt)
    if head and not head.endswith("\n"):
        head += "\n"
    return head + code


def compiles(source: str) -> bool:
    """Whether `source` compiles; nothing runs.

    >>> compiles("def f(:\\n"), compiles("x = 1\\n")
    (False, True)
    """
    try:
        compile(source, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return False
    return True


# ---- tests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallCase:
    """`assert f(*args, **kwargs) == expected`: the call goes to the sandbox, the parent compares."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    expected: Any


@dataclass(frozen=True)
class ExprCase:
    """Any other assert: trusted dataset code run in the parent with `f` bound to a proxy."""

    source: str


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


def parse_test_list(asserts: list[str], entry_point: str) -> list[CallCase | ExprCase]:
    """MBPP-style assert strings, one case each: a (call, expected) pair where the assert is
    `f(literals) == literal`, else the assert's source to evaluate in the parent.

    >>> parse_test_list(["assert add(2, 3) == 5", "assert add(b=1, a=1) == 2"], "add")
    [CallCase(args=(2, 3), kwargs={}, expected=5), CallCase(args=(), kwargs={'b': 1, 'a': 1}, expected=2)]
    >>> parse_test_list(["assert abs(mean([1, 2]) - 1.5) < 1e-9"], "mean")
    [ExprCase(source='assert abs(mean([1, 2]) - 1.5) < 1e-9')]
    """
    cases: list[CallCase | ExprCase] = []
    for text in asserts:
        try:
            tree = ast.parse(text.strip())
        except SyntaxError:
            cases.append(ExprCase(text))  # still counted: it fails when run, as it would under MBPP
            continue
        node = tree.body[0] if len(tree.body) == 1 else None
        case = _as_call_case(node.test, entry_point) if isinstance(node, ast.Assert) else None
        cases.append(case or ExprCase(text.strip()))
    return cases


def strict_equal(got: Any, expected: Any) -> bool:
    """Equality that does not trust `==` across types: bool only equals bool, a list never equals
    a tuple, containers compare element by element; int and float compare by value, floats with
    a relative tolerance of 1e-9 (summation order differs between correct solutions).

    >>> strict_equal(1, True), strict_equal([1, 2], (1, 2)), strict_equal(0.1 + 0.2, 0.3), strict_equal(3, 3.0)
    (False, False, True, True)
    >>> strict_equal({"a": [1, (2, "x")]}, {"a": [1, (2, "x")]})
    True
    """
    numbers = (int, float)
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if type(got) in numbers and type(expected) in numbers:
        if type(got) is int and type(expected) is int:
            return got == expected
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=0.0) or got == expected
    if type(got) is not type(expected):
        sets = (set, frozenset)
        return type(got) in sets and type(expected) in sets and got == expected
    if type(got) in (list, tuple):
        return len(got) == len(expected) and all(strict_equal(a, b) for a, b in zip(got, expected))
    if type(got) is dict:
        return got.keys() == expected.keys() and all(strict_equal(got[k], expected[k]) for k in got)
    return got == expected  # str, bytes, None, complex, sets: builtin equality is exact


PASSED = "__grpo_passed__"  # the global the rewritten check counts passed units in


def check_units(test_source: str) -> tuple[str, int]:
    """HumanEval's `check(candidate)` rewritten so each top-level statement of its body that holds
    an assert is one test unit: a unit that raises counts as failed and the rest still run.

    Returns the rewritten source and the number of units (0 when the body has no assert: then
    `check` returning at all is the one unit). The rewritten `check` adds one to the global
    `PASSED` per passing unit. Statements without an assert (setup) run as written; if one
    raises, `check` raises and the units not reached count as failed.

    >>> source, units = check_units("def check(candidate):\\n    x = 2\\n    assert candidate(x) == 4\\n"
    ...                             "    assert candidate(0) == 0\\n")
    >>> units
    2
    >>> namespace = {PASSED: 0}
    >>> exec(source, namespace)
    >>> namespace["check"](lambda v: 4)
    >>> namespace[PASSED]
    1
    """
    tree = ast.parse(test_source)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise ValueError("the `test` source defines no check(candidate) function")
    body: list[ast.stmt] = [ast.Global([PASSED])]
    units = 0
    for stmt in check.body:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            body.append(stmt)
            continue
        units += 1
        body.append(
            ast.Try(
                body=[stmt, ast.parse(f"{PASSED} += 1").body[0]],
                handlers=[ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None, body=[ast.Pass()])],
                orelse=[],
                finalbody=[],
            )
        )
    check.body = body
    return ast.unparse(ast.fix_missing_locations(tree)), units


def output_lines(text: str) -> list[str]:
    """Stdout normalised for comparison: each line right-stripped, trailing empty lines dropped.

    >>> output_lines("3 4  \\n5\\r\\n\\n\\n")
    ['3 4', '5']
    """
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
