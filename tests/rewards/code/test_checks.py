"""The tests' side of the task formats: MBPP asserts by AST, strict equality, check() units, io lines."""

from __future__ import annotations

from grpo_cli.rewards.code.checks import (
    EQUAL,
    TALLY,
    CallCase,
    ExprCase,
    UnitTally,
    check_units,
    output_lines,
    parse_test_list,
    strict_equal,
)


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
