"""Reward functions `f(prompts, completions, **columns) -> list[float | None]` and their fusion.

sources (what each configured reward is) -> executor (call them, failures become NaN, timeouts)
-> fusion (normalise, mask failing functions, weighted mean), over one RewardBatch. No Hydra and
no core imports here: a library user can score completions with the code the trainer uses.
"""

from grpo_cli.rewards.batch import COMPLETION_LENGTHS, RewardBatch
from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.executor import BatchScores, RewardExecutor, concat_scores
from grpo_cli.rewards.fusion import EnvironmentDown, FusionResult, NoRewardLeft, RewardFusion
from grpo_cli.rewards.reward_model import RewardModelScorer
from grpo_cli.rewards.rows import RowScores, score_each
from grpo_cli.rewards.scoring import fuse_rewards, score_and_fuse, score_batch, with_environment_columns
from grpo_cli.rewards.sources import (
    RewardSource,
    check_columns,
    required_columns,
    resolve_reward_sources,
    reward_diagnostics,
)

__all__ = [
    "BUILTIN_REWARDS",
    "COMPLETION_LENGTHS",
    "BatchScores",
    "EnvironmentDown",
    "FusionResult",
    "NoRewardLeft",
    "RewardBatch",
    "RewardExecutor",
    "RewardFusion",
    "RewardModelScorer",
    "RewardSource",
    "RowScores",
    "check_columns",
    "concat_scores",
    "fuse_rewards",
    "required_columns",
    "resolve_reward_sources",
    "reward_diagnostics",
    "score_each",
    "score_and_fuse",
    "score_batch",
    "with_environment_columns",
]
