"""Reward functions as a TRL user writes them for GRPOTrainer (TRL's documented signatures), imported
by path (target: tests.rewards.trl_functions:...). They record what they were handed in SEEN, so a
test can check the call TRL would have made."""

from __future__ import annotations

from typing import Any

SEEN: list[dict[str, Any]] = []  # one entry per call, in-process runs only


def longer_is_better(completions, **kwargs):
    """TRL's `def f(completions, **kwargs)`: text, or the assistant message for chat data."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    SEEN.append({"fn": "longer_is_better", "completions": completions, "prompts": kwargs["prompts"], **kwargs})
    return [float(len(t)) / 100 for t in texts]


def shorter_in_tokens(prompts, completions, completion_ids, **kwargs):
    """TRL's `def f(prompts, completions, completion_ids, **kwargs)`, logging as TRL's rewards may."""
    state = kwargs["trainer_state"]
    SEEN.append({"fn": "shorter_in_tokens", "ids": completion_ids, "step": state.global_step, **kwargs})
    kwargs["log_metric"]("mean_ids", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    kwargs["log_extra"]("ids_seen", [len(ids) for ids in completion_ids])
    return [-float(len(ids)) for ids in completion_ids]


def answer_in_completion(completions, answer, **kwargs):
    """A TRL reward reading a data column by name; parallel-safe (keeps no state)."""
    kwargs["log_metric"]("rows", float(len(completions)))
    return [float(str(a) in c) for c, a in zip(completions, answer)]


def no_completions(x):
    """Neither ours nor TRL's: refused at start-up."""
    return [0.0]


def turns_from_the_environments(completions, environments, **kwargs):
    """TRL 1.16's multi-turn reward (GRPOTrainer(environment_factory=...)): `environments` holds each
    completion's environment instance, `completions` each whole conversation after the prompt."""
    SEEN.append({"fn": "turns_from_the_environments", "completions": completions, "environments": environments})
    return [float(env.turns) for env in environments]
