"""The `math` reward: which text is the answer, equivalent forms, near-misses, failure isolation."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.math_answer import MAX_CHARS, extract_answer, math_answer


def score(completion: str, gold: object) -> float | None:
    return math_answer(["q"], [completion], answer=[gold])[0]


def test_registered_as_math() -> None:
    assert BUILTIN_REWARDS["math"] is math_answer


# ---- which text is the answer -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>4 + 4 = 8</think><answer>9</answer>", "9"),  # the block, not the reasoning
        ("<answer>1</answer> oops <answer>2</answer>", "2"),  # the last block
        ("so \\boxed{\\frac{1}{2}} and later 7", "\\frac{1}{2}"),  # boxed beats a later stray number
        ("\\boxed{1} then \\boxed{\\sqrt{4}}", "\\sqrt{4}"),  # the last boxed, braces balanced
        ("first 3, then 1,250.5 in total", "1,250.5"),
        ("10-3 is 7, and 3/4 of that", "3/4"),
        ("she owes -35 dollars", "-35"),
        ("10-3", "3"),  # a minus between digits is subtraction, not a sign
        ("\\boxed{12", "12"),  # an unclosed box falls through to the last number
        ("<answer>42", "42"),  # so does an unclosed answer block: structure is `format`'s job
        ("no number at all", None),
    ],
)
def test_extract_answer(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


def test_only_the_tail_is_read() -> None:
    head = "<answer>5</answer>"
    assert extract_answer(head + "x" * MAX_CHARS) is None
    assert extract_answer(head + "x" * (MAX_CHARS - len(head))) == "5"


# ---- equivalent forms score 1 -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer_text", "gold"),
    [
        ("1/2", "0.5"),
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("$\\frac{1}{2}$", "1/2"),
        ("\\dfrac{3}{4}", "0.75"),
        ("$\\frac12$", "0.5"),
        ("2.50", "2.5"),
        ("2.5", "5/2"),
        ("3.0", "3"),
        ("1,500", "1500"),
        ("1,250.50", "1250.5"),
        ("12 cm", "12"),
        ("7 \\text{ cm}", "7"),
        ("$5", "5"),
        ("\\$5", "5"),
        ("5 dollars", "5"),
        ("x = 5", "5"),
        ("-3", "-3"),
        ("\u22123", "-3"),  # Unicode minus sign
        ("- 3", "-3"),
        ("(-3)", "-3"),
        ("20%", "20"),  # math-verify's choice, kept: a percentage matches its number...
        ("20%", "0.2"),  # ...and its fraction
        ("0.333333", "1/3"),  # decimals compare rounded to 6 places
        ("7/24", "7/24"),
        ("14/48", "7/24"),  # unreduced fractions are equal too
    ],
)
def test_equivalent_forms_score_one(answer_text: str, gold: str) -> None:
    assert score(f"<think>work</think><answer>{answer_text}</answer>", gold) == 1.0


@pytest.mark.parametrize(
    "completion",
    ["The total is \\boxed{1500}.", "so she pays $1,500", "1500", "1 500 is the answer: 1500"],
)
def test_boxed_and_last_number_fallbacks(completion: str) -> None:
    assert score(completion, "1500") == 1.0


def test_gold_may_be_a_number_not_a_string() -> None:
    assert math_answer(
        ["q"] * 3, ["<answer>4</answer>", "<answer>2.5</answer>", "<answer>3</answer>"], answer=[4, 2.5, 4]
    ) == [1.0, 1.0, 0.0]


# ---- near-misses score 0 ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer_text", "gold"),
    [
        ("2.49", "2.5"),
        ("2.51", "2.5"),
        ("12", "21"),
        ("-5", "5"),
        ("5", "-5"),
        ("0.333", "1/3"),  # wrong in the 4th decimal place
        ("1/3", "3"),
        ("150", "1500"),
        ("1500.5", "1500"),
        ("20", "0.2"),  # without a % sign 20 is twenty
        ("five", "5"),  # words are not numbers
        ("", "5"),
        ("I am not sure", "5"),
    ],
)
def test_near_misses_score_zero(answer_text: str, gold: str) -> None:
    assert score(f"<think>work</think><answer>{answer_text}</answer>", gold) == 0.0


def test_the_answer_block_wins_over_the_reasoning() -> None:
    """The right number in the reasoning does not rescue a wrong answer, and vice versa."""
    assert score("<think>it is 8</think><answer>9</answer>", "8") == 0.0
    assert score("<think>maybe 9</think><answer>8</answer>", "8") == 1.0


def test_mixed_numbers_are_not_understood() -> None:
    """Documented limit: "3 1/2" is not 7/2 (the prompt asks for a/b)."""
    assert score("<answer>3 1/2</answer>", "7/2") == 0.0


# ---- data errors give None, policy errors give 0 ------------------------------------------------
@pytest.mark.parametrize("gold", ["", "   ", "n/a", "unknown", None])
def test_unparseable_gold_is_none(gold: object) -> None:
    assert score("<answer>5</answer>", gold) is None


def test_one_bad_gold_does_not_spoil_the_batch() -> None:
    out = math_answer(["q"] * 3, ["<answer>1</answer>"] * 3, answer=["1", "???", "2"])
    assert out == [1.0, None, 0.0]


def test_math_verify_exception_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("sympy fell over")

    monkeypatch.setattr(math_verify, "verify", boom)
    assert math_answer(["q"] * 2, ["<answer>1</answer>", "<answer>2</answer>"], answer=["1", "x+"]) == [
        0.0,
        None,
    ]


def test_math_verify_timeout_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's TimeoutException derives from BaseException: it must still become 0.0."""
    import math_verify
    from math_verify.errors import TimeoutException

    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(math_verify, "verify", slow)
    assert score("<answer>1</answer>", "1") == 0.0


def test_keyboard_interrupt_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(math_verify, "verify", interrupted)
    with pytest.raises(KeyboardInterrupt):
        score("<answer>1</answer>", "1")


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>" + "\\frac{1}{" * 150 + "2" + "}" * 150 + "</answer>",  # deep nesting: parse times out
        "<answer>9^9^9</answer>",  # parses fine, the comparison times out
        "<answer>$\\frac{1}{2$ \\boxed{ \\left( </answer>",  # malformed LaTeX
        "<answer>" + "9" * 5000 + "</answer>",  # over MAX_CHARS: the open tag is cut off
        " ".join(str(i) for i in range(20000)),  # 100k characters of numbers
        "7\x00\x00",
    ],
)
def test_pathological_completions_score_zero_in_bounded_time(completion: str) -> None:
    start = time.perf_counter()
    assert score(completion, "5") == 0.0
    assert time.perf_counter() - start < 10  # two parses and one comparison, 1 s timeout each


@pytest.mark.parametrize(
    "answer_text",
    ["10^{10^{10^{10}}}", "9^{123456789}", "9**123456789", "2^{2^{30}}", "1000000!", "9^9^9"],
)
def test_answers_sympy_would_hang_on_score_zero_without_calling_it(
    answer_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the main thread there is no alarm: 10^{10^{10^{10}}} ran > 60 s, 9^{123456789} > 40 s."""
    import math_verify

    calls = []
    monkeypatch.setattr(math_verify, "parse", lambda *a, **k: calls.append(a) or [])
    assert score(f"<answer>{answer_text}</answer>", "5") == 0.0
    assert calls == []


@pytest.mark.parametrize(("answer_text", "gold"), [("2^{10}", "1024"), ("2^3 \\cdot 3^2", "72"), ("10^{-2}", "0.01")])
def test_ordinary_powers_still_parse(answer_text: str, gold: str) -> None:
    assert score(f"<answer>{answer_text}</answer>", gold) == 1.0


def test_works_outside_the_main_thread() -> None:
    """math-verify's SIGALRM timeout raises in threads; there the timeout is off, not the reward."""
    out: list = []
    thread = threading.Thread(
        target=lambda: out.extend(
            math_answer(["q"] * 2, ["<answer>1/2</answer>", "<answer>3</answer>"], answer=["0.5", "4"])
        )
    )
    thread.start()
    thread.join(timeout=60)
    assert out == [1.0, 0.0]


def test_fast_enough_for_a_training_step() -> None:
    """A step of 256 ordinary completions must not be dominated by scoring."""
    completions = [f"<think>{i} apples and more apples</think><answer>{i % 50}</answer>" for i in range(256)]
    math_answer(["q"], completions[:1], answer=["0"])  # the first call pays sympy/antlr warm-up
    start = time.perf_counter()
    out = math_answer(["q"] * 256, completions, answer=[str(i % 7) for i in range(256)])
    assert time.perf_counter() - start < 10
    assert out == [float(i % 50 == i % 7) for i in range(256)]
