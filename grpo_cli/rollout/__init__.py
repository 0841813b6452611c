"""Generation backends behind one small interface, so a faster one (vLLM) can replace HF."""

from grpo_cli.rollout.base import Generator, Rollout, completion_mask_from_eos
from grpo_cli.rollout.engine import make_generator, with_sampling_weights
from grpo_cli.rollout.fast import FastGenerator
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.vllm import VLLMGenerator

__all__ = [
    "FastGenerator",
    "Generator",
    "HFGenerator",
    "Rollout",
    "VLLMGenerator",
    "completion_mask_from_eos",
    "make_generator",
    "with_sampling_weights",
]
