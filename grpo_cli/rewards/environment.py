"""Rewards that read what a multi-turn rollout's environment reported (env.*, docs/environments.md)."""

from __future__ import annotations

from typing import Any


def env_reward(prompts: list[Any], completions: list[str], env_reward: list[Any], **_: Any) -> list[float | None]:
    """The environment's own reward for each trajectory (its `reward()`, a TRL environment's
    `get_reward()`); None where it gave none.

    >>> env_reward(["p", "p"], ["a", "b"], env_reward=[1.0, None])
    [1.0, None]
    """
    return [None if value is None else float(value) for value in env_reward]


def code_feedback_final(
    prompts: list[Any], completions: list[str], env_turn_scores: list[Any], **_: Any
) -> list[float | None]:
    """env=code_feedback: the share of the task's test units the last answer passed (the score of
    the answer the trajectory ended on, as code_tests with mode=fraction counts it).

    >>> code_feedback_final(["p", "p"], ["a", "b"], env_turn_scores=[[0.0, 1.0], [0.5]])
    [1.0, 0.5]
    """
    return [scores[-1] if scores else None for scores in env_turn_scores]


def code_feedback_improvement(
    prompts: list[Any], completions: list[str], env_turn_scores: list[Any], **_: Any
) -> list[float | None]:
    """env=code_feedback: how much the feedback helped, the last answer's score minus the first's
    (0 for a trajectory solved, or ended, on its first answer); in [-1, 1].

    >>> code_feedback_improvement(["p", "p", "p"], ["a", "b", "c"], env_turn_scores=[[0.0, 1.0], [1.0], [0.5, 0.25]])
    [1.0, 0.0, -0.25]
    """
    return [
        None if not scores or None in (scores[0], scores[-1]) else scores[-1] - scores[0] for scores in env_turn_scores
    ]
