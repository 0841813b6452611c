"""Rewards on the shape of a completion rather than its answer: format, length, repetition."""

from __future__ import annotations

import re
from typing import Any

from grpo_cli.rewards.rows import score_each

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
THINK_THEN_ANSWER = re.compile(r"\s*<think>.*?</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
CHARS_PER_TOKEN = 4  # rough English average, used only when the trainer passes no token counts


def _well_formed(text: str) -> bool:
    if any(text.count(tag) != 1 for tag in TAGS):  # repeated, nested or missing blocks
        return False
    match = THINK_THEN_ANSWER.fullmatch(text)  # in order, closed, nothing but whitespace outside
    return match is not None and bool(match.group(1).strip())


def think_answer_format(prompts: list[Any], completions: list[str], **_: Any) -> list[float | None]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>`, else 0.0.

    Strict (docs/architecture.md §3, seed 004): each tag exactly once, closed, think before answer, only
    whitespace before, between and after the blocks. The answer must not be blank; the think
    block may be (Qwen3-style templates emit an empty one when thinking is off). A chat template
    that puts `<think>` into the prompt leaves the completion without it: that scores 0 here.

    >>> think_answer_format(["q"] * 3, [
    ...     "<think>3 rows of 4</think>\\n<answer>12</answer>",
    ...     "<think>3 rows of 4</think><answer>12",
    ...     "<answer>12</answer><think>3 rows of 4</think>"])
    [1.0, 0.0, 0.0]
    """
    return score_each(lambda c: float(_well_formed(c)), completions)


def overlong(
    prompts: list[Any],
    completions: list[str],
    completion_lengths: list[int] | None = None,
    *,
    max_length: int,
    buffer: int,
    **_: Any,
) -> list[float | None]:
    """DAPO's soft overlong penalty: 0 up to max_length - buffer, then down linearly to -1.

    With L the completion's length in tokens (DAPO, Yu et al. 2025, arXiv 2503.14476):
    0 for L <= max_length - buffer; (max_length - buffer - L) / buffer inside the buffer;
    -1 beyond max_length (and -1 at max_length itself, where the ramp ends).
    `max_length` is normally rollout.max_new_tokens. Token counts come from the reserved
    column `completion_lengths`, which the trainer passes; without it the length is
    estimated as characters / 4, which is only right for English text and common tokenizers.

    >>> overlong(["q"] * 4, ["", "", "", ""], completion_lengths=[60, 70, 80, 90], max_length=80, buffer=20)
    [0.0, -0.5, -1.0, -1.0]
    >>> overlong(["q"], ["x" * 280], max_length=80, buffer=20)  # no token counts: 280 chars ~ 70 tokens
    [-0.5]
    """
    if max_length < 1 or not 0 < buffer <= max_length:
        raise ValueError(f"overlong: need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}")
    if completion_lengths is None:
        completion_lengths = [len(c) / CHARS_PER_TOKEN for c in completions]
    soft_limit = max_length - buffer

    def penalty(length: float) -> float:
        if length <= soft_limit:
            return 0.0
        return (soft_limit - length) / buffer if length <= max_length else -1.0

    return score_each(penalty, completion_lengths)


def repetition(
    prompts: list[Any], completions: list[str], *, ngram_size: int = 3, max_penalty: float = -1.0, **_: Any
) -> list[float | None]:
    """Penalty for repeated word n-grams: max_penalty times the share of n-grams that repeat.

    As open-r1's repetition penalty (Yeo et al. 2025, arXiv 2502.03373, app. C.2): words are the lower-cased,
    whitespace-split text; share = 1 - distinct n-grams / all n-grams, so 0 means no n-gram
    occurs twice. Empty completions and those shorter than `ngram_size` words score 0.

    >>> repetition(["q"] * 3, ["the cat sat on the mat", "go go go go go", "hi"])
    [0.0, -0.6666666666666667, 0.0]
    >>> repetition(["q"], ["a b a b a b"], ngram_size=2, max_penalty=-0.5)
    [-0.3]
    """
    if max_penalty > 0:
        raise ValueError(f"repetition: max_penalty must be <= 0, got {max_penalty}")
    if ngram_size < 1:
        raise ValueError(f"repetition: ngram_size must be >= 1, got {ngram_size}")

    def penalty(completion: str) -> float:
        words = completion.lower().split()
        if len(words) < ngram_size:
            return 0.0
        ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        repeated_share = 1 - len(set(ngrams)) / len(ngrams)
        return max_penalty * repeated_share if repeated_share else 0.0

    return score_each(penalty, completions)
