"""Rollouts with transformers' `generate`: batched, sampled, with the KV cache."""

from __future__ import annotations

import difflib
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.generation_checks import check_generation_kwargs
from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import is_peft
from grpo_cli.module_mode import evaluating
from grpo_cli.rollout.base import Rollout, TokenProgress, finish_rollout

# generate's warpers that act only when it samples: left out of the greedy config, where
# GenerationConfig would warn that they are ignored
SAMPLING_ONLY = ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")


def generate_options(cfg: RolloutConfig) -> dict[str, Any]:
    """`rollout.generation_kwargs` for GenerationConfig. A key it has no field for is refused:
    GenerationConfig keeps any keyword as an attribute that generate never reads, so a misspelt or
    vLLM-only option would sample without it, silently."""
    check_generation_kwargs(cfg)
    known = [key for key in GenerationConfig().to_dict() if not key.startswith("_") and key != "transformers_version"]
    for key in cfg.generation_kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise GrpoError(
                f"rollout.generation_kwargs.{key}: not an option of transformers' generate (GenerationConfig){hint} "
                "(vLLM's SamplingParams options need rollout.backend=vllm)"
            )
    return dict(cfg.generation_kwargs)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Chat models often stop on several tokens (e.g. <|im_end|> and <|endoftext|>)."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class HFGenerator:
    on_token: TokenProgress | None = None  # generate() reports no tokens on the way (Generator)

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer)
        # Built explicitly from rollout.* so a checkpoint's own generation_config (repetition penalty,
        # top_k=50) cannot silently change the sampling distribution the loss assumes.
        options = generate_options(cfg)
        common = {
            "max_new_tokens": cfg.max_new_tokens,
            "min_new_tokens": cfg.min_new_tokens,
            "repetition_penalty": cfg.repetition_penalty,  # a processor: greedy applies it too, as generate
            "eos_token_id": self.eos_ids,
            "pad_token_id": tokenizer.pad_token_id,
            "use_cache": True,
        }
        self.sampling = GenerationConfig(
            **{
                "do_sample": True,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": cfg.top_k,
                "min_p": cfg.min_p,
                **common,
                **options,
            }
        )
        greedy_options = {key: value for key, value in options.items() if key not in SAMPLING_ONLY}
        self.greedy = GenerationConfig(**{"do_sample": False, **common, **greedy_options})

    def weights_updated(self) -> None:
        """Nothing to refresh: this loop samples from the policy module itself."""

    def set_step_seed(self, seed: int) -> None:
        """Nothing to seed: this loop draws from torch's stream, which the trainer carries (Generator)."""

    def close(self) -> None:
        """Nothing held beyond the policy module (Generator)."""

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout:
        prompt_ids = prompt_ids.repeat_interleave(num_generations, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0)
        # generate() fills every key our config leaves unset (None) from the model's own
        # generation_config: a checkpoint's repetition_penalty, min_p or no_repeat_ngram_size would
        # change the distribution the loss assumes. For this call the model's defaults are ours (on
        # the model itself: a LoRA policy's generate() reads its base model's).
        inner = self.model.get_base_model() if is_peft(self.model) else self.model
        model_defaults = inner.generation_config
        settings = self.greedy if greedy else self.sampling
        inner.generation_config = settings
        try:
            with evaluating(self.model):
                output = self.model.generate(
                    input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=settings
                )
        finally:
            inner.generation_config = model_defaults
        completion_ids = output[:, prompt_ids.size(1) :]
        return finish_rollout(prompt_ids, prompt_mask, completion_ids, self.eos_ids, self.tokenizer, num_generations)
