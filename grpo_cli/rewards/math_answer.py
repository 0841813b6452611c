"""`math`: 1 when the completion's final answer is mathematically equal to the `answer` column.

Equivalence is decided by math-verify (Hugging Face's answer checker, also used by open-r1 and
TRL): 1/2 = 0.5 = \\frac{1}{2}, 2.50 = 2.5, 1,500 = 1500, and units or currency around a number
are ignored. This module only decides *which* text is the answer and keeps math-verify's failure
modes (exceptions, slow inputs) from reaching the trainer.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from functools import lru_cache
from types import ModuleType
from typing import Any

MAX_CHARS = 2000  # only the completion's tail is read: the answer is at the end, and parse cost grows with length
TIMEOUT_S = 1  # per parse and per comparison; math-verify's alarm counts whole seconds

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Integers with optional thousands separators, decimals and simple fractions: 1,500  -2.5  3/4.
# A minus sign counts only when it is not a subtraction ("10-3" ends in 3, not -3).
LAST_NUMBER = re.compile(r"(?:(?<![\w.)])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
LATEX_MARKS = re.compile(r"[\\^{}_]")  # bare LaTeX, which math-verify reads right only inside $...$
TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
# Exact values sympy would spend minutes or forever on (10^{10^{10}}, 9^{123456789}, 1000000!),
# measured; outside the main thread math-verify has no timeout, so these score 0 without a call.
TOO_COSTLY = re.compile(r"(?:\^|\*\*)\s*\{?\s*(?:[\w.()]*\s*(?:\^|\*\*)|-?\d{4,})|\d{4,}\s*!")


class _TimeoutOffIsKnown(logging.Filter):
    """math-verify warns once that its timeout is off; here that is deliberate (see `_timeout`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@lru_cache(maxsize=1)
def _math_verify() -> ModuleType:
    """0.6 s of sympy/antlr imports, paid only by a run that uses `math`."""
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_TimeoutOffIsKnown())
    return math_verify


def _last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}`, braces balanced; None when absent or unclosed."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    open_at = start + len("\\boxed")
    while open_at < len(text) and text[open_at].isspace():
        open_at += 1
    if open_at >= len(text) or text[open_at] != "{":
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def extract_answer(completion: str) -> str | None:
    """The text that holds the final answer, by precedence; None when there is none.

    The last `<answer>...</answer>` block, else the last `\\boxed{...}`, else the last number.
    Only the last MAX_CHARS characters are read.

    >>> extract_answer("<think>2 + 3 = 5, times 2</think><answer> 10 </answer>")
    ' 10 '
    >>> extract_answer("So the total is \\\\boxed{\\\\frac{3}{4}}."), extract_answer("3 + 4 = 7 apples")
    ('\\\\frac{3}{4}', '7')
    >>> extract_answer("no digits here") is None
    True
    """
    text = completion[-MAX_CHARS:]
    blocks = ANSWER_BLOCK.findall(text)
    if blocks:
        return blocks[-1]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = LAST_NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _normalise(text: str) -> str:
    text = text.replace("\u2212", "-")  # Unicode minus: math-verify finds no number in "−3"
    text = text.replace("\\$", " ").replace("\\%", "%")  # escaped currency hides the number from it
    text = TEXT_WRAPPER.sub(r" \1 ", text)  # "5\text{ apples}" -> "5 apples": a unit, not a symbol
    return re.sub(r"^\s*-\s+(?=\d)", "-", text).strip()  # "- 3" would parse as 3


def _parse(text: str, timeout: int | None) -> list[Any]:
    """math-verify's parse, retried inside `$...$`, where it also reads bare LaTeX and "(-3)".

    Bare LaTeX goes wrapped first, because unwrapped `3\\frac{1}{2}` reads as 1/2 and `2^{10}`
    as 2. Plain text with letters is never wrapped: `$5 dollars$` and `$five$` read as
    products of symbols.
    """
    text = _normalise(text)
    if not text or TOO_COSTLY.search(text):
        return []
    wrapped = f"${text}$"
    if LATEX_MARKS.search(text) and "$" not in text:
        attempts = (wrapped, text)
    elif re.search("[A-Za-z$]", text):
        attempts = (text,)
    else:
        attempts = (text, wrapped)
    for attempt in attempts:
        parsed = _math_verify().parse(attempt, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


@lru_cache(maxsize=4096)
def _parse_gold(text: str, timeout: int | None) -> tuple[Any, ...]:
    """Each prompt's answer is scored against G completions: parse it once.

    Empty when nothing parsed to a number or expression: math-verify's leftover raw string
    ("???" gives ["???"]) would only ever match itself character for character.
    """
    parsed = _parse(text, timeout)
    return tuple(parsed) if any(not isinstance(p, str) for p in parsed) else ()


def _timeout() -> int | None:
    """math-verify times out with SIGALRM: only in the main thread, only on POSIX.

    Elsewhere it raises on every call (threads) or forks a process per call (Windows), so there
    the timeout is off and only MAX_CHARS and TOO_COSTLY bound the work. The trainer calls a
    reward in a watchdog thread unless its `timeout_s` is 0: conf/reward/math.yaml sets 0.
    """
    if os.name == "posix" and threading.current_thread() is threading.main_thread():
        return TIMEOUT_S
    return None


def _score(completion: str, gold: tuple[Any, ...], timeout: int | None) -> float:
    span = extract_answer(completion)
    predicted = _parse(span, timeout) if span is not None else []
    return float(bool(predicted) and _math_verify().verify(list(gold), predicted, timeout_seconds=timeout))


def math_answer(prompts: list[Any], completions: list[str], answer: list[Any], **_: Any) -> list[float | None]:
    """1.0 when the completion's answer equals the `answer` column mathematically, else 0.0.

    The answer is the last `<answer>` block, else the last `\\boxed{}`, else the last number
    (see `extract_answer`); an unclosed `<answer>` falls through to the last number, since
    structure is the `format` reward's job. Equal: fractions, decimals and LaTeX (1/2 = 0.5 =
    \\frac{1}{2}), trailing zeros (2.50 = 2.5), thousands separators (1,500), and units or
    currency around the number ("12 cm", "$5", "5 dollars"). Not equal: 2.49 vs 2.5, 12 vs 21,
    -5 vs 5. Percentages follow math-verify: "20%" matches a gold answer of 20 and of 0.2.
    Mixed numbers ("3 1/2") are not understood: write 7/2 or 3.5. Decimals are compared
    rounded to 6 places, so 0.333333 matches 1/3 and 0.333 does not.

    A completion math-verify cannot parse, or that raises or times out (1 s per parse or
    comparison), scores 0.0: it is the policy's fault; so does one whose exact value would take
    sympy minutes (a power tower, a 4-digit exponent or factorial: see TOO_COSTLY). An
    `answer` that parses to nothing is a data error: None.

    >>> math_answer(["q"] * 5, ["<answer>1/2</answer>", "<answer>0.5</answer>",
    ...     "so $\\\\boxed{\\\\frac{1}{2}}$", "<answer>0.49</answer>", "the answer is 2"], answer=["0.5"] * 5)
    [1.0, 1.0, 1.0, 0.0, 0.0]
    >>> math_answer(["q"] * 2, ["<answer>1,500 dollars</answer>", "<answer>1500</answer>"], answer=[1500, "n/a"])
    [1.0, None]
    """
    timeout = _timeout()
    scores: list[float | None] = []
    for completion, expected in zip(completions, answer):
        try:
            gold = _parse_gold(str(expected).strip(), timeout) if expected is not None else ()
        except Exception:  # math-verify already turns its own errors into []; this is belt and braces
            gold = ()
        if not gold:
            scores.append(None)
            continue
        try:
            scores.append(_score(completion, gold, timeout))
        except Exception:
            scores.append(0.0)
        except BaseException as err:  # math-verify's TimeoutException derives from BaseException
            if type(err).__name__ != "TimeoutException":
                raise
            scores.append(0.0)
    return scores
