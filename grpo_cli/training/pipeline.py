"""The stages a training step and an evaluation share: prompts -> G completions -> fused rewards."""

from __future__ import annotations

from typing import Any

import torch

from grpo_cli.rewards import FusionResult, RewardBatch, RewardExecutor, RewardFusion, score_and_fuse
from grpo_cli.rollout import Generator, Rollout
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.stats import nanmean


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


def evaluate_greedy(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    executor: RewardExecutor,
    fusion: RewardFusion,
    weights: dict[str, float] | None = None,
) -> dict[str, float]:
    """One greedy answer per held-out prompt, scored without touching the fusion's state.

    A group of one has no rivals, so group normalisations are off (`grouped=False`): the
    per-function means are raw scores and the fused reward is their weighted mean.
    """
    if not examples:  # no held-out split (data.eval_fraction=0): nothing to report
        return {}
    rollout = generate_groups(examples, encoder, generator, 1, greedy=True)
    result = score_rollout(examples, rollout, executor, fusion, weights, update_state=False, grouped=False)
    out = {"eval/reward/mean": nanmean(result.fused)}
    out.update({f"eval/reward/{name}/mean": nanmean(values) for name, values in result.per_function.items()})
    return out
