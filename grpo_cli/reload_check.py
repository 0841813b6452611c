"""An exported model reloaded the way its users will load it, with plain transformers, against the
logits it was exported from: what `grpo export` verifies before anything is renamed into place, and
what `grpo check` asks of a model family."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

# Short texts of the kinds the shipped tasks use; any text encodes with any tokenizer.
VERIFY_PROMPTS = ("1+2=", "What is 17 * 3? Answer:", "def add(a, b):\n    return", "The quick brown fox")
# Largest |logit difference| allowed, as a share of the source's largest |logit| (at least 1). fp32
# only reorders sums (the LoRA merge); half precision rounds every weight and activation, and the
# error compounds over the layers (bf16 keeps 8 mantissa bits, fp16 11).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def prompt_logits(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[torch.Tensor]:
    """Each prompt alone (no padding to get wrong), logits upcast to float32."""
    logits = []
    for prompt in VERIFY_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")
        logits.append(model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits[0].float())
    return logits


def verify(
    directory: Path,
    dtype: torch.dtype,
    tokenizer: PreTrainedTokenizerBase,
    source: list[torch.Tensor],
    trust_remote_code: bool,
) -> tuple[float, float]:
    """(largest |logit difference|, tolerance) of the exported directory reloaded the way its users
    will, with plain transformers, against the checkpoint's own logits."""
    exported = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, trust_remote_code=trust_remote_code)
    difference = max((a - b).abs().max().item() for a, b in zip(prompt_logits(exported.eval(), tokenizer), source))
    scale = max(1.0, max(s.abs().max().item() for s in source))
    return difference, TOLERANCE[dtype] * scale
