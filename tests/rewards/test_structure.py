"""Shape rewards: the strict think/answer format, DAPO's overlong penalty, n-gram repetition."""

from __future__ import annotations

import inspect

import pytest

from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.structure import overlong, repetition, think_answer_format


def test_registered_names() -> None:
    assert BUILTIN_REWARDS["format"] is think_answer_format
    assert BUILTIN_REWARDS["overlong"] is overlong
    assert BUILTIN_REWARDS["repetition"] is repetition


# ---- format -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion",
    [
        "<think>6 * 7 = 42</think><answer>42</answer>",
        "<think>\nstep one\nstep two\n</think>\n<answer>\n42\n</answer>\n",  # newlines anywhere
        "  <think>a</think>   <answer>b</answer>  ",  # whitespace outside and between
        "<think></think><answer>42</answer>",  # an empty think block (thinking switched off)
        "<think>1 < 2 and 3 > 2</think><answer>x<y</answer>",  # angle brackets that are not tags
    ],
)
def test_format_well_formed(completion: str) -> None:
    assert think_answer_format(["q"], [completion]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "<think>6 * 7 = 42</think><answer>42",  # answer unclosed (truncated)
        "<think>6 * 7 = 42<answer>42</answer>",  # think unclosed
        "<think>6 * 7 = 42</think>42</answer>",  # answer never opened
        "<answer>42</answer><think>6 * 7</think>",  # reordered
        "</think><think>x</think><answer>42</answer>",  # a stray closing tag
        "<think>a</think><think>b</think><answer>42</answer>",  # think repeated
        "<think>a</think><answer>41</answer><answer>42</answer>",  # answer repeated
        "<think>a<think>b</think></think><answer>42</answer>",  # nested think
        "<think>draft <answer>41</answer></think><answer>42</answer>",  # answer nested in think
        "Sure! <think>a</think><answer>42</answer>",  # text before
        "<think>a</think><answer>42</answer> Hope this helps.",  # text after
        "<think>a</think> so <answer>42</answer>",  # text between
        "<answer>42</answer>",  # no think block
        "<think>a</think>",  # no answer block
        "<think>a</think><answer>  </answer>",  # blank answer
        "<THINK>a</THINK><ANSWER>42</ANSWER>",  # tags are case-sensitive
        "",
    ],
)
def test_format_broken(completion: str) -> None:
    assert think_answer_format(["q"], [completion]) == [0.0]


def test_format_scores_each_completion() -> None:
    good, bad = "<think>a</think><answer>1</answer>", "<answer>1</answer>"
    assert think_answer_format(["q"] * 3, [good, bad, good]) == [1.0, 0.0, 1.0]


# ---- overlong (DAPO) --------------------------------------------------------------------------
# max_length L = 100, buffer C = 20: the ramp runs over (80, 100].
@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (79, 0.0),
        (80, 0.0),  # L - C: the last length without penalty
        (81, -0.05),  # (80 - 81) / 20
        (90, -0.5),  # (80 - 90) / 20, the middle of the ramp
        (99, -0.95),  # (80 - 99) / 20
        (100, -1.0),  # L: the ramp ends at -1
        (101, -1.0),  # beyond L
        (10_000, -1.0),
    ],
)
def test_overlong_regions(length: int, expected: float) -> None:
    out = overlong(["q"], ["ignored"], completion_lengths=[length], max_length=100, buffer=20)
    assert out == [pytest.approx(expected)]


def test_overlong_is_continuous_at_both_ends_of_the_ramp() -> None:
    out = overlong(["q"] * 4, [""] * 4, completion_lengths=[80, 80.0001, 99.9999, 100], max_length=100, buffer=20)
    assert out == pytest.approx([0.0, -0.000005, -0.999995, -1.0])


def test_overlong_uses_token_counts_not_text_when_given() -> None:
    out = overlong(["q"] * 2, ["x" * 1000, ""], completion_lengths=[10, 100], max_length=100, buffer=20)
    assert out == [0.0, -1.0]


@pytest.mark.parametrize(
    ("chars", "expected"),
    [(320, 0.0), (324, -0.05), (360, -0.5), (400, -1.0), (404, -1.0)],  # chars / 4 = 80, 81, 90, 100, 101
)
def test_overlong_falls_back_to_chars_over_four(chars: int, expected: float) -> None:
    assert overlong(["q"], ["x" * chars], max_length=100, buffer=20) == [pytest.approx(expected)]


def test_overlong_buffer_equal_to_max_length_ramps_from_zero() -> None:
    assert overlong(["q"] * 3, [""] * 3, completion_lengths=[0, 5, 10], max_length=10, buffer=10) == [
        0.0,
        -0.5,
        -1.0,
    ]


@pytest.mark.parametrize(("max_length", "buffer"), [(100, 0), (100, -5), (100, 101), (0, 0)])
def test_overlong_rejects_impossible_settings(max_length: int, buffer: int) -> None:
    with pytest.raises(ValueError, match="buffer"):
        overlong(["q"], ["x"], max_length=max_length, buffer=buffer)


def test_overlong_signature_fits_the_reward_machinery() -> None:
    """The lengths column is optional (so data without it still composes); the limits are config
    kwargs, keyword-only, so a data column can never fill them by position."""
    params = inspect.signature(overlong).parameters
    assert params["completion_lengths"].default is None
    assert params["max_length"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["buffer"].kind is inspect.Parameter.KEYWORD_ONLY


def test_overlong_ignores_other_columns() -> None:
    out = overlong(["q"], ["x"], completion_lengths=[90], answer=["4"], max_length=100, buffer=20)
    assert out == [-0.5]


# ---- repetition -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("the quick brown fox jumps over the lazy dog", 0.0),  # "the" twice, but no 3-gram twice
        ("a a a a a", -2 / 3),  # 3 trigrams, 1 distinct: share 1 - 1/3
        ("the cat the cat the cat", -0.5),  # 4 trigrams, 2 distinct
        ("The cat THE cat the CAT", -0.5),  # case-insensitive
        ("the  cat\nthe\tcat the cat", -0.5),  # any whitespace splits words
        ("one two three", 0.0),  # exactly n words: one trigram
        ("one two", 0.0),  # shorter than n
        ("", 0.0),
        ("   ", 0.0),
    ],
)
def test_repetition_default_trigrams(completion: str, expected: float) -> None:
    assert repetition(["q"], [completion]) == [pytest.approx(expected)]


def test_repetition_never_returns_negative_zero() -> None:
    assert str(repetition(["q"], ["no repeats at all here"])[0]) == "0.0"


def test_repetition_settings() -> None:
    assert repetition(["q"], ["a a b"], ngram_size=1) == [pytest.approx(-1 / 3)]  # 3 words, 2 distinct
    assert repetition(["q"], ["a a a a a"], max_penalty=-0.3) == [pytest.approx(-0.2)]  # -0.3 * 2/3
    assert repetition(["q"], ["a b a b a b"], ngram_size=2) == [pytest.approx(-0.6)]  # 5 bigrams, 2 distinct


def test_repetition_bounded_by_max_penalty() -> None:
    out = repetition(["q"], ["spam " * 10_000], max_penalty=-1.0)
    assert -1.0 <= out[0] < -0.999


@pytest.mark.parametrize(("kwargs", "match"), [({"max_penalty": 0.5}, "max_penalty"), ({"ngram_size": 0}, "ngram")])
def test_repetition_rejects_impossible_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        repetition(["q"], ["a b c"], **kwargs)
