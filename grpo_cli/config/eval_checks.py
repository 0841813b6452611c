"""The value checks of `grpo eval`, apart from the others because eval may read a rollouts file
instead of generating, and its pass@k needs k completions of each prompt."""

from __future__ import annotations

from grpo_cli.config.checks import (
    CHOICES,
    check_at_least_one,
    check_choice,
    check_rewards_chosen,
    check_split_selects,
    check_threads,
    fail,
)
from grpo_cli.config.env_checks import validate_env
from grpo_cli.config.generation_checks import check_sampling_only, validate_generation
from grpo_cli.config.schema import SPLITS, EvalConfig


def validate_eval(cfg: EvalConfig) -> None:
    """`grpo eval`: a rollouts file (input=) needs no model or data set, so those are checked only
    when it generates; pass@k needs k <= n, checked here for n = rollout.num_generations and
    against the file's group size once it is read."""
    if cfg.input is None:
        validate_generation(cfg.model, cfg.data, cfg.rollout)
        check_sampling_only(cfg.rollout)
        validate_env(cfg.env)
        check_choice("split", cfg.split, SPLITS)
        check_choice("precision.dtype", cfg.precision.dtype, CHOICES["precision.dtype"])
        check_split_selects(cfg.split, cfg.data)
    check_at_least_one({"rollout.num_generations": cfg.rollout.num_generations, "batch_size": cfg.batch_size})
    if cfg.max_prompts < 0:
        fail("max_prompts", cfg.max_prompts, "must be >= 0 (0: every prompt)")
    check_threads("threads", cfg.threads)
    check_rewards_chosen(cfg.reward)
    if any(k < 1 for k in cfg.eval.k):
        fail("eval.k", list(cfg.eval.k), "every k must be at least 1")
    n = cfg.rollout.num_generations
    if cfg.input is None and any(k > n for k in cfg.eval.k):
        fail("eval.k", list(cfg.eval.k), f"pass@k needs k <= rollout.num_generations={n} completions per prompt")
