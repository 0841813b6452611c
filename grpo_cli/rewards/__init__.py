"""Reward functions `f(prompts, completions, **columns) -> list[float | None]` and their fusion.

No Hydra imports here: a library user can score completions with the same code the trainer uses.
"""

from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.fusion import RewardFunction, check_columns, fuse_rewards, resolve_reward_functions

__all__ = ["BUILTIN_REWARDS", "RewardFunction", "check_columns", "fuse_rewards", "resolve_reward_functions"]
