"""Code task formats, the candidate's side: from a completion to a program, and what its source
names (the screen before efficiency credit). The tests' side is `checks.py`.

A completion is either a whole program or a function body that continues the prompt; a markdown
fence around it is dropped. Tests come in the public shapes (docs/architecture.md §5): `test` (HumanEval's
`check(candidate)`), `test_list` (MBPP's assert strings) and `io` (stdin/stdout pairs). Nothing here
runs candidate code.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import Any

MAX_SOURCE_CHARS = 100_000  # every cheap check works on at most this much of a completion
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)  # first block; an unclosed one runs to the end


def column(values: list[Any] | None, n: int) -> list[Any]:
    """A data column as a list of `n` rows; all None when the batch has no such column."""
    return [None] * n if values is None else list(values)


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


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a top-level statement binds `name` (def, class, assignment or import)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names)
    return False


def parse_source(source: str) -> ast.Module | None:
    """The module, or None where `source` does not parse (or is too deep or large to)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def defines_at_top_level(source: str, name: str) -> bool:
    """Whether `source` binds `name` at module level (def, class, assignment or import).

    A function body alone does not parse, so a line-start `def name(` counts as well.

    >>> defines_at_top_level("def add(a, b):\\n    return a + b\\n", "add")
    True
    >>> defines_at_top_level("    return a + b\\n", "add")
    False
    """
    tree = parse_source(source)
    if tree is None:
        return re.search(rf"^(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None
    return any(_binds(node, name) for node in tree.body)


DEFINITIONS = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def prompt_definitions(prompt: Any, skip: str | None = None) -> str:
    """The prompt's own top-level definitions (imports, functions, classes, constants) as source,
    without the one that binds `skip`; "" when the prompt is not Python (a question in prose).

    HumanEval prompts define helpers the task needs (a `poly` the solution evaluates, an
    `encode_*` whose output the candidate decodes): a completion that writes the whole function
    still runs with them, and the trusted check sees them too. Other statements (a doctest run,
    a print) are left out: definitions are all a test may rely on.

    >>> print(prompt_definitions('import math\\n\\ndef poly(xs, x):\\n    return sum(xs)\\n\\n'
    ...                          'def find_zero(xs):\\n    pass\\n', skip="find_zero"))
    import math
    <BLANKLINE>
    def poly(xs, x):
        return sum(xs)
    >>> prompt_definitions("Write a function that adds two numbers.")
    ''
    """
    return _definitions(prompt_text(prompt), skip)


@lru_cache(maxsize=1024)  # the same prompts come back every epoch, G completions at a time
def _definitions(text: str, skip: str | None) -> str:
    tree = parse_source(text)
    if tree is None:
        return ""
    kept = [node for node in tree.body if isinstance(node, DEFINITIONS) and not (skip and _binds(node, skip))]
    return "\n\n".join(ast.unparse(node) for node in kept)


def assemble_program(prompt: Any, completion: Any, entry_point: str | None) -> str:
    """The program to judge: the fence-stripped completion, after the prompt's code when the
    completion does not define `entry_point` itself (it is then the body the prompt opened), else
    after the prompt's other definitions (its imports and helpers), as HumanEval runs it.

    Stdin/stdout tasks (no entry point) take the completion as the whole program.

    >>> prompt = 'def double(x):\\n    \"\"\"Twice x.\"\"\"\\n'
    >>> print(assemble_program(prompt, "```python\\n    return 2 * x\\n```", "double"), end="")
    def double(x):
        \"\"\"Twice x.\"\"\"
        return 2 * x
    >>> assemble_program(prompt, "def double(x):\\n    return x + x\\n", "double")
    'def double(x):\\n    return x + x\\n'
    >>> print(assemble_program("import math\\n" + prompt, "def double(x):\\n    return math.fsum([x, x])\\n", "double"))
    import math
    <BLANKLINE>
    def double(x):
        return math.fsum([x, x])
    <BLANKLINE>
    """
    code = strip_fences(completion)
    if not entry_point:
        return code
    if defines_at_top_level(code, entry_point):
        helpers = prompt_definitions(prompt, skip=entry_point)
        return f"{helpers}\n\n{code}" if helpers else code
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


# Efficiency credit needs an honest instruction count from inside the sandbox. Code that reaches
# into the interpreter (tracing, frames, dynamic attribute access or code, other processes and
# threads) could stop or forge the count, so it gets none (its test score is unaffected).
INTROSPECTION = frozenset(
    {
        "settrace", "setprofile", "gettrace", "getprofile", "monitoring", "_getframe", "f_trace",
        "f_trace_opcodes", "f_trace_lines", "f_back", "f_globals", "f_locals", "tb_frame", "gi_frame",
        "cr_frame", "modules", "__main__", "__import__", "importlib", "builtins", "__builtins__", "eval",
        "exec", "compile", "getattr", "setattr", "delattr", "vars", "globals", "locals", "__dict__",
        "__globals__", "__code__", "__getattribute__", "__subclasses__", "attrgetter", "methodcaller",
        "ctypes", "gc", "inspect", "threading", "_thread", "multiprocessing", "subprocess", "os", "posix",
        "signal", "concurrent", "asyncio", "marshal", "pickle", "sys",
    }
)  # fmt: skip


def reaches_into_interpreter(source: str) -> bool:
    """Whether code names (or spells in a string) anything in INTROSPECTION. `sys` is allowed only
    as `sys.stdin`, `sys.stdout`, `sys.setrecursionlimit` and `sys.maxsize`.

    >>> reaches_into_interpreter("def f(xs):\\n    return sorted(set(xs))\\n")
    False
    >>> reaches_into_interpreter("import sys\\ndef f(xs):\\n    sys.settrace(None)\\n    return xs\\n")
    True
    >>> reaches_into_interpreter("import sys\\nn = int(sys.stdin.readline())\\nprint(n)\\n")
    False
    >>> reaches_into_interpreter("    return len(set(nums)) < len(nums)\\n")  # a body, read inside a def
    False
    """
    tree = parse_source(source) or parse_source(f"def _():\n{source}")
    if tree is None:
        return True
    allowed_sys = {"stdin", "stdout", "setrecursionlimit", "maxsize"}
    sys_uses = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in allowed_sys}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            word = node.id
            if word == "sys" and id(node) in sys_uses:
                continue
        elif isinstance(node, ast.Attribute):
            word = node.attr
        elif isinstance(node, ast.alias):
            word = node.name.split(".")[0]
            if word == "sys":
                continue  # the uses are checked where they are made
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(name in node.value for name in INTROSPECTION if len(name) > 3):
                return True
            continue
        else:
            continue
        if word in INTROSPECTION:
            return True
    return False
