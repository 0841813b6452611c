"""Short-answer rewards: exact match, dense partial credit, and the GSM8K-style last number."""

from __future__ import annotations

import re
from typing import Any

from grpo_cli.rewards.rows import score_each

ANSWER_CHARS = set("0123456789-")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def exact_match(prompts: list[Any], completions: list[str], answer: list[Any], **_: Any) -> list[float | None]:
    """1.0 when the completion, stripped of surrounding whitespace, equals the answer.

    >>> exact_match(["1+1="], ["2"], answer=["2"]), exact_match(["1+1="], [" 2 \\n"], answer=[2])
    ([1.0], [1.0])
    >>> exact_match(["1+1="], ["22"], answer=["2"])
    [0.0]
    """
    return score_each(lambda c, a: float(c.strip() == str(a).strip()), completions, answer)


def _partial_credit(completion: str, answer: str) -> float:
    if completion == answer:
        return 1.0
    if not completion or not answer:
        return 0.0
    digit_frac = sum(ch in ANSWER_CHARS for ch in completion) / len(completion)
    length_score = 1.0 / (1.0 + abs(len(completion) - len(answer)))
    matches = sum(c == a for c, a in zip(completion, answer)) / len(answer)
    return 0.2 * digit_frac + 0.2 * length_score + 0.6 * matches


def answer_partial_credit(
    prompts: list[Any], completions: list[str], answer: list[Any], **_: Any
) -> list[float | None]:
    """Dense credit for short answers: answer-like characters, the right length, right digits.

    An exact-match reward from a random init is zero for a long time, so nothing in a group
    differs and no gradient flows; this one separates completions from the first step.
    Weights: 0.2 for the share of digit/sign characters, 0.2 for 1/(1+|length error|),
    0.6 for the share of the answer's characters right in their position; exact scores 1.

    >>> answer_partial_credit(["2+2="], ["4", "5", "4x", ""], answer=["4"] * 4)
    [1.0, 0.4, 0.8, 0.0]
    """
    return score_each(lambda c, a: _partial_credit(c.strip(), str(a).strip()), completions, answer)


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def last_number(prompts: list[Any], completions: list[str], answer: list[Any], **_: Any) -> list[float | None]:
    """1.0 when the last number in the completion equals the numeric answer (GSM8K style).

    Plain numbers only (no fractions or LaTeX); the `math` reward handles equivalent forms.

    >>> last_number(["q"] * 3, ["so 3 + 4 = 7", "It is 1,500.", "no idea"], answer=["7", "1500", "3"])
    [1.0, 1.0, 0.0]
    """
    return score_each(_last_number_matches, completions, answer)


def _last_number_matches(completion: str, expected: Any) -> float:
    found = NUMBER.findall(completion)
    got = _as_number(found[-1]) if found else None
    want = _as_number(str(expected))
    return float(got is not None and want is not None and abs(got - want) < 1e-9)
