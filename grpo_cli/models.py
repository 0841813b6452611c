"""Load the policy, its tokenizer and (when KL is on) a frozen reference.

The tiny model is built from a config with a byte-level tokenizer made in code, then saved and
reloaded through `from_pretrained`, so tests exercise exactly the path a real model takes.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from grpo_cli.config.schema import ModelConfig, TinyModelConfig
from grpo_cli.errors import GrpoError

TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
# A plain-text chat template so conversational prompts also work with the tiny model.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(name: str | None) -> torch.device:
    """`auto` (or unset): CUDA when there is one, else the CPU; anything else as torch names it."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level: every UTF-8 string encodes, one token per byte, so any data set composes."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for token in TINY_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def build_tiny_model(directory: str | Path, size: TinyModelConfig, seed: int) -> Path:
    """Write a random-init Llama and its tokenizer to `directory`; returns the directory."""
    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads,
        max_position_embeddings=size.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Left padding so every prompt ends where generation starts; pad falls back to EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise GrpoError(f"tokenizer in {path} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    cfg: ModelConfig,
    workdir: Path,
    seed: int,
    device: torch.device,
    precision_dtype: str,
    weights_dir: Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Path]:
    """Returns (model in train mode, tokenizer, the starting model's directory).

    `weights_dir` (a checkpoint being resumed) supplies the weights; the returned directory is
    still the starting model's, which the KL reference must come from.
    """
    if cfg.kind == "tiny":
        path = Path(cfg.path) if cfg.path else workdir / "tiny_model"
        if not (path / "config.json").exists():
            build_tiny_model(path, cfg.tiny, seed)
    else:
        path = Path(cfg.path)
        if not (path / "config.json").exists():
            raise GrpoError(f"model.path={path}: no config.json, not a Hugging Face model directory")
    dtype_name = precision_dtype if cfg.dtype == "auto" else cfg.dtype
    source = weights_dir or path
    try:
        tokenizer = load_tokenizer(source, cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=DTYPES[dtype_name], trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise GrpoError(f"model.path={source}: cannot load: {err}") from err
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.to(device)
    model.train()
    return model, tokenizer, path


def frozen_reference(policy: PreTrainedModel, starting_dir: Path | None = None) -> PreTrainedModel:
    """The starting policy for the KL term; never trained, never in grad mode.

    A fresh run copies the policy; a resumed one reloads the starting model from `starting_dir`,
    since the policy has moved.
    """
    if starting_dir is None:
        reference = copy.deepcopy(policy)
    else:
        reference = AutoModelForCausalLM.from_pretrained(starting_dir, dtype=policy.dtype).to(policy.device)
    reference.eval()
    reference.requires_grad_(False)
    return reference
