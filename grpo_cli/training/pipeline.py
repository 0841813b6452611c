"""The stages a training step and an evaluation share: prompts -> G completions -> fused rewards."""

from __future__ import annotations

from typing import Any

import torch

from grpo_cli.evaluation import ScoredSamples, SuccessRule, sample_metrics
from grpo_cli.rewards import FusionResult, RewardBatch, RewardExecutor, RewardFusion, score_and_fuse
from grpo_cli.rollout import Generator, Rollout
from grpo_cli.rollout.prompts import PromptEncoder


@torch.no_grad()
def generate_groups(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    group_size: int,
    greedy: bool = False,
) -> Rollout:
    prompt_ids, prompt_mask = encoder([ex["prompt"] for ex in examples])
    return generator.generate(prompt_ids, prompt_mask, group_size, greedy=greedy)


def score_rollout(
    examples: list[dict[str, Any]],
    rollout: Rollout,
    executor: RewardExecutor,
    fusion: RewardFusion,
    weights: dict[str, float] | None = None,
    update_state: bool = True,
    grouped: bool = True,
) -> FusionResult:
    """Token counts (EOS included) are the lengths the `overlong` reward reads."""
    batch = RewardBatch.from_groups(examples, rollout.texts, rollout.lengths.tolist(), rollout.group_size)
    return score_and_fuse(executor, fusion, batch, weights, update_state=update_state, grouped=grouped)


def generate_and_score(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    executor: RewardExecutor,
    fusion: RewardFusion,
    group_size: int,
    batch_size: int,
    greedy: bool = False,
    weights: dict[str, float] | None = None,
) -> ScoredSamples:
    """Evaluation's rollouts, `batch_size` prompts at a time, scored without touching the fusion's state.

    Eval completions are not rivals whose differences are learnt from, so group normalisations are
    off (`grouped=False`): per-function means are raw scores and the fused reward is their
    weighted mean, whatever the group size (a z-score within a greedy group of one is always 0).
    """
    samples = ScoredSamples(group_size)
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        rollout = generate_groups(batch, encoder, generator, group_size, greedy=greedy)
        result = score_rollout(batch, rollout, executor, fusion, weights, update_state=False, grouped=False)
        samples.add(result.fused, result.per_function, rollout.lengths.tolist(), rollout.truncated.tolist())
    return samples


def evaluate_greedy(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    executor: RewardExecutor,
    fusion: RewardFusion,
    rule: SuccessRule,
    batch_size: int,
    weights: dict[str, float] | None = None,
) -> dict[str, float]:
    """One greedy answer per held-out prompt: accuracy, reward/mean, reward/<fn>/mean, length/mean,
    truncated/rate. The trainer logs them under `eval/`, `grpo eval` under `greedy/`: one function,
    so a checkpoint's figures agree between the two."""
    if not examples:  # no held-out split (data.eval_fraction=0): nothing to report
        return {}
    samples = generate_and_score(examples, encoder, generator, executor, fusion, 1, batch_size, True, weights)
    return sample_metrics(samples, rule)
