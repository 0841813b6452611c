"""The one scoring path of train, score and eval: call every reward source not masked on a batch,
take a multi-turn rollout's environment columns in (its failed rows out of every function's
judgement), then fuse (`fusion.RewardFusion`). Apart from the fusion because it is what runs the
functions, where the fusion only combines numbers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpo_cli.environments import ENV_ERROR
from grpo_cli.rewards.batch import RewardBatch
from grpo_cli.rewards.executor import BatchScores, RewardExecutor
from grpo_cli.rewards.fusion import FusionResult, RewardFusion
from grpo_cli.rewards.sources import RewardSource

Combine = Callable[[dict[str, BatchScores]], dict[str, BatchScores]]


def score_batch(
    executor: RewardExecutor, fusion: RewardFusion, batch: RewardBatch, combine: Combine | None = None
) -> dict[str, BatchScores]:
    """Every source's raw scores for `batch`, by name, before any fusion: each source not masked
    is called (a masked one is not called again and scores NaN).

    Apart from `score_and_fuse` so a caller can look at a batch's scores before deciding what to
    fuse: dynamic sampling (training/dynamic_sampling.py) scores every draw once and fuses only
    the groups it keeps. `combine`: see `score_and_fuse`."""
    n = len(batch)
    active = [s for s in fusion.sources if s.name not in fusion.masked]
    scores = executor.run(active, batch.prompts, batch.completions, batch.columns)
    for s in fusion.sources:  # masked ones still carry the batch length when nothing else does
        scores.setdefault(s.name, BatchScores([math.nan] * n))
    if not scores:  # no reward configured: nothing can score anything
        scores = {"": BatchScores([math.nan] * n)}
    return combine(scores) if combine is not None else scores


def with_environment_columns(
    batch: RewardBatch, columns: dict[str, list[Any]], combine: Combine | None
) -> Combine | None:
    """A multi-turn rollout's per-row environment columns (env_reward, env_turn_scores, ...) join the
    batch's; the returned `combine` first takes the rows whose environment failed out of every
    function's judgement, so those rows are out of the step whatever a function made of their text.

    Such a row is NaN and `BatchScores.env_failed`, not a row error or a missing column: under
    `on_row_error=zero` a row error would score 0 and train on it, and either would count or alert
    against a function that had nothing of that row's to judge. The fusion counts those rows
    against the environment instead (`RewardFusion`: an environment failing every row stops the run)."""
    if not columns:
        return combine
    batch.columns.update(columns)
    failed = {i: str(why) for i, why in enumerate(columns.get(ENV_ERROR) or []) if why is not None}
    if not failed:
        return combine

    def mark(scores: dict[str, BatchScores]) -> dict[str, BatchScores]:
        for result in scores.values():
            for i in failed:
                result.values[i] = math.nan
                result.row_errors.pop(i, None)
            result.missing = {c: [i for i in rows if i not in failed] for c, rows in result.missing.items()}
            result.missing = {c: rows for c, rows in result.missing.items() if rows}
            result.env_failed.update(failed)
        return scores if combine is None else combine(scores)

    return mark


def score_and_fuse(
    executor: RewardExecutor,
    fusion: RewardFusion,
    batch: RewardBatch,
    weights: dict[str, float] | None = None,
    update_state: bool = True,
    grouped: bool = True,
    combine: Combine | None = None,
) -> FusionResult:
    """The one scoring path of train, score and eval: call every source not masked (a masked one
    is not called again), then fuse.

    `combine` (data-parallel training) turns this process's scores into the global batch's, in
    process order, before the fusion: normalisation statistics, failure counts and masks then
    see every completion, and every process fuses the same batch into the same state."""
    scores = score_batch(executor, fusion, batch, combine)
    return fusion.fuse(scores, batch.group_size, weights, update_state=update_state, grouped=grouped)


def fuse_rewards(
    sources: list[RewardSource],
    weights: dict[str, float] | None,
    prompts: list[Any],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> tuple[list[float], dict[str, list[float]]]:
    """One-shot and stateless (no running stats, no masking, no timeouts, the batch as one group):
    (fused reward per completion, raw values per function). For a library user scoring a list;
    training keeps a RewardFusion across batches and calls score_and_fuse.

    >>> from grpo_cli.rewards.builtin import exact_match
    >>> fuse_rewards([RewardSource("em", exact_match)], None, ["1+1="] * 2, ["2", "3"], {"answer": ["2", "2"]})
    ([1.0, 0.0], {'em': [1.0, 0.0]})
    """
    batch = RewardBatch(list(prompts), list(completions), dict(columns), max(1, len(completions)))
    with RewardExecutor(num_workers=0, default_timeout_s=None) as executor:
        result = score_and_fuse(executor, RewardFusion(sources), batch, weights)
    return result.fused, result.per_function
