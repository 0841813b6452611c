"""A reward for tests/training/test_learn.py: importable by path, as users' rewards are."""

from __future__ import annotations


def unscorable_first_prompt(
    prompts: list[str], completions: list[str], unscorable: bool = True, **columns: object
) -> list[float | None]:
    """None (unscorable) for every completion of the batch's first prompt when `unscorable`; else a
    score that differs within a group (the sum of the characters' codes, mod 7).

    >>> unscorable_first_prompt(["a", "a", "b", "b"], ["x", "y", "x", "z"])
    [None, None, 1.0, 3.0]
    """
    return [
        None if unscorable and prompt == prompts[0] else float(sum(map(ord, text)) % 7)
        for prompt, text in zip(prompts, completions)
    ]


def by_position(prompts: list[str], completions: list[str], **columns: object) -> list[float]:
    """A score that differs within every group whatever the completions: the row's position.

    >>> by_position(["a", "a"], ["x", "x"])
    [0.0, 1.0]
    """
    return [float(i) for i in range(len(completions))]
