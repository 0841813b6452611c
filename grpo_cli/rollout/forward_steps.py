"""The model's own forward in the two shapes a sampling loop calls it: the prefill of left-padded
prompts, and one token per running row through its KV cache (rollout.fast, rollout.fixed_decode)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import PreTrainedModel


def cache_argument(model: PreTrainedModel) -> str:
    """The forward keyword a model takes its KV cache by: `cache` (transformers >= 5.20), else
    `past_key_values`. A PEFT wrapper takes **kwargs: its base model's signature decides."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values


def prefill(
    net: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward over the left-padded prompts: their cache, the float32 logits at the last prompt
    token [B, V], and each row's position for the next token [B, 1]."""
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    # the last position by index, not `logits_to_keep=1`: a slice of [B, P, H] is not contiguous,
    # and with frozen weights (the bf16 copy) torch's matmul then multiplies it by B contiguous
    # copies of the output layer (SmolLM2's: 290 ms, against a few ms for an index)
    last = torch.tensor([prompt_ids.size(1) - 1], device=prompt_ids.device)
    out = net(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True, logits_to_keep=last
    )
    return returned_cache(out), out.logits[:, -1].float(), positions[:, -1:] + 1


def decode(
    net: torch.nn.Module, cache: Any, keyword: str, token: torch.Tensor, mask: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """One token per running row through the cache: the next float32 logits [rows, V]. `mask` covers
    the prompt, the completion so far and `token`; `position` is the token's; `keyword` is
    `cache_argument`'s."""
    step = {"input_ids": token.unsqueeze(1), "attention_mask": mask, "position_ids": position, keyword: cache}
    out = net(**step, use_cache=True)
    return out.logits[:, -1].float()
