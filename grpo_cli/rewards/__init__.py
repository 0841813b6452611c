"""Reward functions `f(prompts, completions, **columns) -> list[float | None]` and their fusion.

sources (what each configured reward is) -> executor (call them, failures become NaN, timeouts)
-> fusion (normalise, mask failing functions, weighted mean). No Hydra imports here: a library
user can score completions with the same code the trainer uses.
"""

from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.executor import BatchScores, RewardExecutor
from grpo_cli.rewards.fusion import FusionResult, RewardFusion, fuse_rewards, score_and_fuse
from grpo_cli.rewards.reward_model import RewardModelScorer
from grpo_cli.rewards.sources import RewardSource, check_columns, resolve_reward_sources, reward_diagnostics

resolve_reward_functions = resolve_reward_sources  # the earlier name, still used by config smoke tests

__all__ = [
    "BUILTIN_REWARDS",
    "BatchScores",
    "FusionResult",
    "RewardExecutor",
    "RewardFusion",
    "RewardModelScorer",
    "RewardSource",
    "check_columns",
    "reward_diagnostics",
    "fuse_rewards",
    "resolve_reward_functions",
    "resolve_reward_sources",
    "score_and_fuse",
]
