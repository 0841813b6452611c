"""Reward functions for the worker-pool tests: spawned workers import them by module path."""

from __future__ import annotations

import os
import time

from grpo_cli.rewards import score_each


def length(prompts, completions, **_):
    return [float(len(c)) for c in completions]


def worker_pid(prompts, completions, **_):
    """Which process ran the call: a rebuilt pool shows new pids."""
    return [float(os.getpid())] * len(completions)


def flaky(prompts, completions, **_):
    raise ValueError("flaky")


def half_none(prompts, completions, **_):
    return [None if i % 2 else 1.0 for i in range(len(completions))]


def sleepy(prompts, completions, seconds=10.0, **_):
    time.sleep(seconds)
    return [1.0] * len(completions)


def with_column(prompts, completions, answer, scale=1.0, **_):
    return [scale * float(c == a) for c, a in zip(completions, answer)]


def crash(prompts, completions, **_):
    os._exit(1)  # a segfaulting extension, as far as the pool can tell


def picky(prompts, completions, **_):
    """One completion breaks its scorer (as `B #x` broke pycodestyle); `score_each` isolates it."""

    def score(completion):
        if completion == "boom":
            raise ValueError(f"cannot read {completion!r}")
        return float(len(completion))

    return score_each(score, completions)


def answer_only(prompts, completions, answer):
    """No **kwargs: cannot take the other columns every batch passes (completion_lengths, a, op, b)."""
    return [float(c == a) for c, a in zip(completions, answer)]


def needs_solution(prompts, completions, solution, **_):
    """A named column the arithmetic data does not have."""
    return [float(c == s) for c, s in zip(completions, solution)]


def lengths_only(prompts, completions, completion_lengths, **_):
    """Reads token counts as a named parameter without a default."""
    return [float(n) for n in completion_lengths]
