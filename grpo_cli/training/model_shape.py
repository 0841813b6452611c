"""What the memory plan needs of a model: its sizes and parameter counts, read from its config
alone (the model built on the meta device: no weights, no memory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from grpo_cli.config.schema import LoraConfig, ModelConfig
from grpo_cli.core.packing import packing_unsupported
from grpo_cli.errors import GrpoError
from grpo_cli.lora import all_linear, peft_target_modules
from grpo_cli.model_source import model_directory
from grpo_cli.models import adapter_base, is_adapter_dir, tiny_model_config


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model, read from its config (built on the meta device: no memory)."""

    parameters: int
    layers: int
    hidden: int
    intermediate: int
    q_dim: int  # attention heads x head dim
    kv_dim: int  # KV heads x head dim
    vocab: int
    context: int | None
    output_parameters: int  # the output layer's (tied or not): the first gradient backward writes
    linears: tuple[tuple[str, int, int], ...]  # every Linear: (name, in, out), where LoRA's adapters go
    all_linear: tuple[str, ...]  # the Linears model.lora.target_modules=[all-linear] names (models.all_linear)
    model_type: str  # transformers' model_type: which of those peft's MoE conversion would move
    packable: bool  # the packed layout can train it (core.packing.packing_unsupported: its attention and layer kinds)

    def lora_targets(self, lora: LoraConfig) -> list[tuple[str, int, int]]:
        """The Linears peft adapts: named like a target, or ending in `.target`, `all-linear` read as
        add_lora hands it to peft (models.peft_target_modules)."""
        targets = peft_target_modules(list(lora.target_modules), list(self.all_linear), self.model_type)
        return [m for m in self.linears if any(m[0] == t or m[0].endswith(f".{t}") for t in targets)]

    def lora_parameters(self, lora: LoraConfig) -> int:
        """r x (in + out) per adapted Linear: A is r x in, B is out x r."""
        return sum(lora.r * (fan_in + fan_out) for _, fan_in, fan_out in self.lora_targets(lora))


def model_config(model: ModelConfig) -> PretrainedConfig:
    """The config the loader builds the model from, without its weights: the tiny model's from
    `model.tiny.*` (as models.build_tiny_model writes it), else a directory's config.json (a LoRA
    checkpoint's base; a GGUF file's converted copy, converted the first time as the loader would)."""
    if model.kind == "tiny" and not (model.path and (Path(model.path) / "config.json").is_file()):
        return tiny_model_config(model.tiny)
    path = Path(model.path) if model.kind == "tiny" else model_directory(model)
    if is_adapter_dir(path):
        path = adapter_base(path)
    if not (path / "config.json").is_file():
        raise GrpoError(f"model.path={path}: no config.json, not a Hugging Face model directory")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as err:
        raise GrpoError(f"model.path={path}: cannot read its config.json: {err}") from err


def model_shape(config: PretrainedConfig, trust_remote_code: bool = False) -> ModelShape:
    """Parameter counts from the model built on the meta device (exact for any architecture, tied
    weights once), sizes from the config under Llama's names (transformers maps most others')."""
    try:
        hidden, heads, layers = int(config.hidden_size), int(config.num_attention_heads), int(config.num_hidden_layers)
    except (AttributeError, TypeError) as err:
        raise GrpoError(f"memory plan: the model's config has no transformer sizes ({err})") from err
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, ImportError, OSError, TypeError) as err:  # e.g. a model type this transformers lacks
        raise GrpoError(f"memory plan: cannot build the model from its config: {err}") from err
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    context = getattr(config, "max_position_embeddings", None)
    output = model.get_output_embeddings()
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=layers,
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        q_dim=heads * head_dim,
        kv_dim=int(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
        vocab=int(config.vocab_size),
        context=int(context) if isinstance(context, int) and context > 0 else None,
        output_parameters=sum(p.numel() for p in output.parameters()) if output is not None else 0,
        linears=tuple(
            (name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
        ),
        all_linear=tuple(all_linear(model)),
        model_type=config.model_type,
        packable=packing_unsupported(config) is None,
    )
