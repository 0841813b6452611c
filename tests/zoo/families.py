"""The model zoo: a tiny random-init model of every decoder-only family a 2026 user trains, built from
the installed transformers' own config classes, with the tiny default's byte tokenizer.

Each entry is the family's `model_type` and the overrides that make it tiny (hidden 64, 2-4 layers)
while keeping what makes the family what it is: a sliding window shorter than a completion, hybrid
layer patterns with both kinds of layer, experts, latent attention. A family is added by one entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from grpo_cli.models import build_tiny_tokenizer

WINDOW = 4  # sliding and chunked windows: shorter than the zoo's prompts and completions

COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Family:
    """One family of the zoo: its model_type, what kind of model it is, and its tiny overrides."""

    name: str  # transformers' model_type
    kind: str  # dense | sliding-window | mixture-of-experts | latent-attention | linear-attention hybrid | mamba hybrid
    overrides: dict[str, Any] = field(default_factory=dict)
    users: str = ""  # the models users know it by


MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
LOCAL_MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}
# latent attention: one key/value head per query head, as every real MLA config has (fewer crash transformers' MLA)
MLA = {
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "head_dim": 8,
    "num_key_value_heads": 4,
}
MAMBA2 = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 8}
LINEAR_ATTENTION = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}

FAMILIES: tuple[Family, ...] = (
    Family("llama", "dense", users="Llama 3, SmolLM2"),
    Family("qwen2", "dense", users="Qwen2.5"),
    Family("qwen3", "dense", users="Qwen3"),
    Family("mistral", "sliding-window", {"sliding_window": WINDOW}, users="Mistral"),
    Family("phi3", "dense", {"pad_token_id": None}, users="Phi-3, Phi-4"),
    Family("smollm3", "dense", users="SmolLM3"),
    Family("olmo2", "dense", users="OLMo 2"),
    Family(
        "olmo3",
        "sliding-window",
        {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        users="OLMo 3",
    ),
    Family("granite", "dense", users="Granite 3"),
    Family(
        "gemma2",
        "sliding-window",
        {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        users="Gemma 2",
    ),
    Family(
        "gemma3_text",
        "sliding-window",
        {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        users="Gemma 3",
    ),
    Family(
        "cohere2",
        "sliding-window",
        {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        users="Command R7B, Command A",
    ),
    Family(
        "gpt_oss",
        "sliding-window",
        {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"], **LOCAL_MOE},
        users="gpt-oss",
    ),
    Family("qwen3_moe", "mixture-of-experts", MOE, users="Qwen3-30B-A3B"),
    Family("mixtral", "mixture-of-experts", LOCAL_MOE, users="Mixtral"),
    Family(
        "deepseek_v3",
        "latent-attention",
        {**MLA, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
         "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1},
        users="DeepSeek-V3, Kimi K2",
    ),
    Family(
        "qwen3_5_text",
        "linear-attention hybrid",
        {**LINEAR_ATTENTION, "layer_types": ["linear_attention", "full_attention"]},
        users="Qwen3.5",
    ),
    Family(
        "qwen3_next",
        "linear-attention hybrid",
        {**LINEAR_ATTENTION, **MOE, "layer_types": ["linear_attention", "full_attention"]},
        users="Qwen3-Next",
    ),
    Family("lfm2", "conv hybrid", {"layer_types": ["conv", "full_attention"]}, users="LFM2"),
    Family(
        "nemotron_h",
        "mamba hybrid",
        {"layers_block_type": ["linear_attention", "full_attention", "mlp"], "num_hidden_layers": 3,
         "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 1, "chunk_size": 8},
        users="Nemotron-H, Nemotron Nano 2",
    ),
    Family("falcon_h1", "mamba hybrid", {**MAMBA2, "mamba_d_ssm": 64}, users="Falcon-H1"),
    Family(
        "granitemoehybrid",
        "mamba hybrid",
        {**MAMBA2, "mamba_d_head": 32, **LOCAL_MOE, "layer_types": ["mamba", "attention"]},
        users="Granite 4",
    ),
    Family(
        "llama4_text",
        "chunked attention",
        {"attention_chunk_size": WINDOW, "layer_types": ["chunked_attention", "full_attention"],
         "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 128},
        users="Llama 4",
    ),
)


def tiny_config(family: Family) -> PretrainedConfig:
    """The family's config class, made tiny, with the byte tokenizer's vocabulary and special ids."""
    tokenizer = build_tiny_tokenizer()
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return AutoConfig.for_model(family.name, **{**COMMON, **ids, **family.overrides})


def build(family: Family, directory: str | Path, seed: int = 0) -> Path:
    """Write the family's tiny random-init model and the byte tokenizer to `directory`: what
    `grpo train model=hf model.path=DIRECTORY` loads."""
    directory = Path(directory)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family))
    tokenizer = build_tiny_tokenizer()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
