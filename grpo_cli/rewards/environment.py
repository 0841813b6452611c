"""Rewards that read what a multi-turn rollout's environment reported (env.*, docs/environments.md).

Each row is scored on its own (`score_each`): a value a row's environment reported that is not a
number costs that row, never the batch."""

from __future__ import annotations

from typing import Any

from grpo_cli.rewards.rows import score_each


def env_reward(prompts: list[Any], completions: list[str], env_reward: list[Any], **_: Any) -> list[float | None]:
    """The environment's own reward for each trajectory (its `reward()`, a TRL environment's
    `get_reward()`); None where it gave none.

    >>> env_reward(["p", "p"], ["a", "b"], env_reward=[1.0, None])
    [1.0, None]
    """
    return score_each(lambda value: None if value is None else float(value), env_reward)


def code_feedback_final(
    prompts: list[Any], completions: list[str], env_turn_scores: list[Any], **_: Any
) -> list[float | None]:
    """env=code_feedback: the share of the task's test units the last answer passed (the score of
    the answer the trajectory ended on, as code_tests with mode=fraction counts it).

    >>> code_feedback_final(["p", "p"], ["a", "b"], env_turn_scores=[[0.0, 1.0], [0.5]])
    [1.0, 0.5]
    """
    return score_each(lambda scores: _turn_score(scores, -1), env_turn_scores)


def code_feedback_improvement(
    prompts: list[Any], completions: list[str], env_turn_scores: list[Any], **_: Any
) -> list[float | None]:
    """env=code_feedback: how much the feedback helped, the last answer's score minus the first's
    (0 for a trajectory solved, or ended, on its first answer); in [-1, 1].

    >>> code_feedback_improvement(["p", "p", "p"], ["a", "b", "c"], env_turn_scores=[[0.0, 1.0], [1.0], [0.5, 0.25]])
    [1.0, 0.0, -0.25]
    """

    def improvement(scores: Any) -> float | None:
        first, last = _turn_score(scores, 0), _turn_score(scores, -1)
        return None if first is None or last is None else last - first

    return score_each(improvement, env_turn_scores)


def _turn_score(scores: Any, turn: int) -> float | None:
    """One answer's score in a row's env_turn_scores (None: no answer was judged)."""
    if not scores or scores[turn] is None:
        return None
    return float(scores[turn])
