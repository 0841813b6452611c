"""Built-in rule rewards. Each is a plain function with the one reward signature."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ANSWER_CHARS = set("0123456789-")


def exact_match(prompts: list[Any], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 when the completion, stripped of surrounding whitespace, equals the answer.

    >>> exact_match(["1+1="], ["2"], answer=["2"]), exact_match(["1+1="], [" 2 \\n"], answer=[2])
    ([1.0], [1.0])
    >>> exact_match(["1+1="], ["22"], answer=["2"])
    [0.0]
    """
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def _partial_credit(completion: str, answer: str) -> float:
    if completion == answer:
        return 1.0
    if not completion:
        return 0.0
    digit_frac = sum(ch in ANSWER_CHARS for ch in completion) / len(completion)
    length_score = 1.0 / (1.0 + abs(len(completion) - len(answer)))
    matches = sum(c == a for c, a in zip(completion, answer)) / max(len(completion), len(answer))
    return 0.25 * digit_frac + 0.25 * length_score + 0.5 * matches


def answer_partial_credit(
    prompts: list[Any], completions: list[str], answer: list[Any], **_: Any
) -> list[float]:
    """Dense credit for short answers: answer-like characters, the right length, right digits.

    An exact-match reward from a random init is zero for a long time, so nothing in a group
    differs and no gradient flows; this one separates completions from the first step.
    Weights: 0.25 for the share of digit/sign characters, 0.25 for 1/(1+|length error|),
    0.5 for characters right in their position; an exact answer scores 1.

    >>> answer_partial_credit(["2+2="], ["4", "5", "4x", ""], answer=["4"] * 4)
    [1.0, 0.75, 0.5416666666666666, 0.0]
    """
    return [_partial_credit(c.strip(), str(a).strip()) for c, a in zip(completions, answer)]


BUILTIN_REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "exact_match": exact_match,
    "answer_partial_credit": answer_partial_credit,
}
