"""The value checks of `grpo rollout`, apart from train's because a rollouts file allows what
training refuses: one completion a prompt, and no reward at all."""

from __future__ import annotations

from grpo_cli.config.checks import check_at_least_one, check_choice, check_split_selects, check_threads, fail
from grpo_cli.config.env_checks import validate_env
from grpo_cli.config.generation_checks import check_sampling_only, validate_generation
from grpo_cli.config.schema import CONSOLES, SPLITS, RolloutRunConfig


def validate_rollout(cfg: RolloutRunConfig) -> None:
    """`grpo rollout`: one group of one is a valid rollouts file (eval-style sampling), so G >= 1."""
    validate_generation(cfg.model, cfg.data, cfg.rollout)
    check_sampling_only(cfg.rollout)
    validate_env(cfg.env)
    check_choice("split", cfg.split, SPLITS)
    check_choice("console", cfg.console, CONSOLES)
    check_at_least_one({"rollout.num_generations": cfg.rollout.num_generations, "batch_size": cfg.batch_size})
    if cfg.max_prompts < 0:
        fail("max_prompts", cfg.max_prompts, "must be >= 0 (0: every prompt of the split)")
    check_threads("threads", cfg.threads)
    check_split_selects(cfg.split, cfg.data)
