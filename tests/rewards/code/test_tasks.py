"""Task formats: fences, prompt + body assembly, MBPP asserts by AST, check() units, io lines."""

from __future__ import annotations

from grpo_cli.rewards.code.tasks import (
    EQUAL,
    TALLY,
    CallCase,
    ExprCase,
    UnitTally,
    assemble_program,
    check_units,
    compiles,
    defines_at_top_level,
    output_lines,
    parse_test_list,
    prompt_text,
    strict_equal,
    strip_fences,
)

PROMPT = 'def add(a, b):\n    """Sum of a and b.\n\n    >>> add(1, 2)\n    3\n    """\n'


# ---- fences ------------------------------------------------------------------------------------
def test_fences_python_plain_and_unclosed_are_stripped() -> None:
    assert strip_fences("```python\nx = 1\n```") == "x = 1\n"
    assert strip_fences("Sure!\n```\nx = 2\n```\nThat is all.") == "x = 2\n"
    assert strip_fences("```py\nx = 3\n") == "x = 3\n"  # cut off by max_new_tokens: runs to the end


def test_the_first_of_several_fenced_blocks_is_taken() -> None:
    text = "```python\nfirst = 1\n```\nand a test:\n```python\nassert first == 1\n```\n"
    assert strip_fences(text) == "first = 1\n"


def test_text_without_fences_is_left_alone_and_huge_input_is_capped() -> None:
    assert strip_fences("    return a + b\n") == "    return a + b\n"
    assert len(strip_fences("x" * 300_000)) == 100_000


# ---- assembly ------------------------------------------------------------------------------------
def test_a_function_body_is_appended_to_the_prompt() -> None:
    program = assemble_program(PROMPT, "    return a + b\n", "add")
    assert program == PROMPT + "    return a + b\n"
    namespace: dict = {}
    exec(program, namespace)
    assert namespace["add"](2, 5) == 7


def test_a_fenced_body_is_unfenced_before_assembly() -> None:
    assert assemble_program(PROMPT, "```python\n    return a + b\n```", "add") == PROMPT + "    return a + b\n"


def test_a_whole_program_that_defines_the_entry_point_stands_alone() -> None:
    whole = "import operator\n\n\ndef add(a, b):\n    return operator.add(a, b)\n"
    assert assemble_program(PROMPT, f"Here it is:\n```python\n{whole}```\n", "add") == whole


def test_a_prompt_without_final_newline_and_a_chat_prompt_are_joined_cleanly() -> None:
    assert assemble_program("def f(x):", "    return x\n", "f") == "def f(x):\n    return x\n"
    chat = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": f"```python\n{PROMPT}```"}]
    assert prompt_text(chat) == PROMPT
    assert assemble_program(chat, "    return a + b\n", "add") == PROMPT + "    return a + b\n"


def test_io_programs_are_never_prefixed() -> None:
    assert assemble_program("Read n and print n + 1.", "print(int(input()) + 1)\n", None) == "print(int(input()) + 1)\n"


def test_defines_at_top_level_sees_defs_classes_assignments_and_imports() -> None:
    assert defines_at_top_level("def add(a, b):\n    return a + b\n", "add")
    assert defines_at_top_level("class add:\n    pass\n", "add")
    assert defines_at_top_level("add = lambda a, b: a + b\n", "add")
    assert defines_at_top_level("from operator import add\n", "add")
    assert not defines_at_top_level("def outer():\n    def add(a, b):\n        return a + b\n", "add")
    assert not defines_at_top_level("def adder(a, b):\n    return a + b\n", "add")
    assert defines_at_top_level("def add(a, b):\n    return (\n", "add")  # broken code: the line still counts


def test_compiles_runs_nothing() -> None:
    assert compiles("import os\nos._exit(3)\n")  # compiled, never executed: we are still here
    assert not compiles("def f(:\n")
    assert not compiles("x = '\0'\0")


# ---- MBPP asserts ---------------------------------------------------------------------------------
def test_literal_asserts_become_call_expected_pairs() -> None:
    cases = parse_test_list(
        [
            "assert add(2, 3) == 5",
            "assert add([1], [2]) == [1, 2]",
            'assert add(a="x", b="y") == "xy"',
            "assert (1, 2) == add((1,), (2,))",  # reversed sides
            "assert add(-1, 1.5) == 0.5",
        ],
        "add",
    )
    assert cases == [
        CallCase((2, 3), {}, 5),
        CallCase(([1], [2]), {}, [1, 2]),
        CallCase((), {"a": "x", "b": "y"}, "xy"),
        CallCase(((1,), (2,)), {}, (1, 2)),
        CallCase((-1, 1.5), {}, 0.5),
    ]


def test_other_asserts_stay_source_for_the_parent() -> None:
    asserts = [
        "assert math.isclose(add(0.1, 0.2), 0.3)",  # not `f(...) == literal`
        "assert add(2, 2) != 5",  # another operator
        "assert add(*[1, 2]) == 3",  # starred arguments are not literals
        "assert add(x, 1) == 2",  # a name, not a literal
        "assert set(add([1], [2])) == {1, 2}",  # the call is wrapped
        "assert add(1, 1) == 2 == 2",  # a chained comparison
        "assert other(1, 1) == 2",  # not the entry point
        "assert add(1,",  # broken: kept, and fails when run
    ]
    cases = parse_test_list(asserts, "add")
    assert [case.source for case in cases] == asserts and all(isinstance(c, ExprCase) for c in cases)


# ---- strict equality ---------------------------------------------------------------------------------
def test_strict_equality_does_not_trust_cross_type_equality() -> None:
    assert not strict_equal(True, 1) and not strict_equal(1, True) and not strict_equal(0, False)
    assert not strict_equal([1, 2], (1, 2)) and not strict_equal("1", 1) and not strict_equal(None, 0)
    assert not strict_equal({"a": 1}, {"a": True}) and not strict_equal([[1]], [[1.5]])
    assert strict_equal(2, 2.0) and strict_equal(0.1 + 0.2, 0.3) and not strict_equal(1.0, 1.001)
    assert strict_equal({1, 2}, frozenset({1, 2})) and strict_equal((1, [2, "x"]), (1, [2, "x"]))
    assert strict_equal(None, None) and strict_equal(b"x", b"x") and not strict_equal(b"x", "x")


# ---- HumanEval check() ---------------------------------------------------------------------------------
CHECK = """
import math


def check(candidate):
    limit = 10
    assert candidate(1) == 2
    for x in range(limit):
        assert candidate(x) == x + 1
    if math.pi > 3:
        assert candidate(-1) == 0
    assert candidate(5) == 6, "five"
"""


def _passed(test_source: str, candidate) -> tuple[int, int]:
    """(units passed, units counted): what `code_tests` divides, with a plain function as candidate."""
    source, units = check_units(test_source)
    tally = UnitTally()

    def counted(*args):
        tally.called()
        return candidate(*args)

    namespace: dict = {TALLY: tally, EQUAL: strict_equal}
    exec(source, namespace)
    try:
        namespace["check"](counted)
    except Exception:
        pass
    return tally.passed, units - tally.idle


def test_output_lines_are_right_stripped_and_trailing_blank_lines_dropped_but_counted() -> None:
    assert output_lines("5  \r\n\n7\n\n\n") == ["5", "", "7"]  # a blank line inside still counts
    assert output_lines("5\n") != output_lines("5\n5\n")
    assert output_lines("") == [] == output_lines("\n \n")


def test_each_statement_holding_an_assert_is_one_unit() -> None:
    assert _passed(CHECK, lambda x: x + 1) == (4, 4)
    assert _passed(CHECK, lambda x: 2) == (1, 4)  # only candidate(1) == 2 holds
    assert _passed(CHECK, lambda x: x + 1 if x != 3 else 0) == (3, 4)  # the loop unit fails as a whole


def test_a_unit_that_raises_fails_and_the_rest_still_run() -> None:
    def candidate(x: int) -> int:
        if x == -1:
            raise ZeroDivisionError
        return x + 1

    assert _passed(CHECK, candidate) == (3, 4)  # the `if` unit raised; the last unit still ran


def test_a_check_without_asserts_has_no_units() -> None:
    assert check_units("def check(candidate):\n    candidate(1)\n")[1] == 0


def test_a_call_sent_to_the_sandbox_as_source_keeps_pythons_equal_inside_it() -> None:
    # the sandbox has no strict_equal: only the comparison made here in the parent is rewritten
    (case,) = parse_test_list(["assert f(Span(1, 2), 1 == 1) == True"], "f")
    assert case.code == "assert __grpo_equal__(__grpo_remote__('f(Span(1, 2), 1 == 1)'), True)"
