"""Prompt sources: a seeded synthetic task and local jsonl files, split into train and eval."""

from grpo_cli.data.loading import PromptSampler, check_prompts_per_step, load_examples, split_examples

__all__ = ["PromptSampler", "check_prompts_per_step", "load_examples", "split_examples"]
