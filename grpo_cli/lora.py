"""LoRA adapters through peft: which modules get one (`model.lora.target_modules`, whose default
`all-linear` finds every family's projections) and the fresh adapters themselves."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from grpo_cli.config.schema import LoraConfig
from grpo_cli.errors import GrpoError

if TYPE_CHECKING:  # peft costs seconds to import: only runs that use LoRA pay for it
    from peft import PeftModel

# peft warnings with nothing for a user to act on: a question transformers has deprecated, and an
# adapter on a tied lm_head (grpo export unties it before merging, the one "complication" meant)
PEFT_NOISE = ((FutureWarning, ".*is_gradient_checkpointing.*"), (UserWarning, ".*ensure_weight_tying.*"))


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        for category, message in PEFT_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


ALL_LINEAR = "all-linear"  # in model.lora.target_modules: every linear layer a LoRA adapter can ride (see all_linear)


def all_linear(model: PreTrainedModel) -> list[str]:
    """The full names `all-linear` adapts: every linear layer (nn.Linear, GPT-2's Conv1D) but the
    output head, as PEFT's `all-linear` (verl's default, TRL's examples), less two kinds whose
    adapter would not act as the policy's: a Linear subclass with a forward of its own (Llama 4's
    router returns a tuple, which an adapter cannot add to), and a Mamba mixer's `out_proj`, whose
    fused training kernel (mamba_ssm) reads `out_proj.weight` directly, so an adapter there is
    dropped on the GPU (PEFT refuses it on Nemotron-H and Falcon-H1). A Mamba mixer holds the
    SSM's `A_log` and `D`; Qwen3.5's gated delta net has no `D` and calls its out_proj."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    mamba = [m for m in model.modules() if {"A_log", "D"} <= set(m._parameters) and hasattr(m, "out_proj")]
    mamba_out = {id(m.out_proj) for m in mamba}
    return [
        name
        for name, m in model.named_modules()
        if (isinstance(m, Conv1D) or (isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward))
        and m is not head
        and id(m) not in mamba_out
    ]


def peft_target_modules(target_modules: list[str], linear: list[str], model_type: str) -> list[str]:
    """What peft is handed for `model.lora.target_modules`: a list of names, as written, where
    `all-linear` stands for the full names in `linear` (all_linear's). Dropped from those: the
    names peft's transformers-v5 conversion would move onto fused experts (a dense or shared MLP's
    gate_proj/up_proj/down_proj on DeepSeek-V3 and Qwen3-Next: peft#3711), which an adapter's own
    reload would move again; routed experts (3-D parameters) and routers stay frozen."""
    named = [t for t in target_modules if t != ALL_LINEAR]
    if len(named) == len(target_modules):
        return named
    return [*_kept_by_peft(linear, model_type), *named]


def _kept_by_peft(names: list[str], model_type: str) -> list[str]:
    """`names` less those peft's v4-to-v5 MoE conversion (run on every adapter it injects, fresh or
    reloaded) rewrites into expert parameters: asked of the conversion itself, on a copy."""
    import types

    from peft import LoraConfig as PeftLoraConfig

    try:
        from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
    except ImportError:  # a peft before transformers v5: no conversion
        return names
    probe = PeftLoraConfig(target_modules=list(names))
    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(model_type=model_type))  # all a list's remap reads
    convert_peft_config_for_transformers(probe, model=stand_in, conversions=None)
    kept = set(probe.target_modules or ())
    return [name for name in names if name in kept]


def add_lora(model: PreTrainedModel, lora: LoraConfig) -> PeftModel:
    """Fresh adapters on `lora.target_modules`, every other weight frozen. B starts at zero, so the
    policy starts as the base model and the KL to it is 0 until the first update. A name that
    matches no module is an error (peft's own check only fails when nothing at all matches)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    asked = list(lora.target_modules)
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in asked if t != ALL_LINEAR and not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in all_linear(model)})
        raise GrpoError(
            f"model.lora.target_modules={asked}: {missing} not found in {type(model).__name__} "
            f"(its linear layers: {', '.join(leaves)}; or [{ALL_LINEAR}])"
        )
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=peft_target_modules(asked, all_linear(model), model.config.model_type),
        task_type="CAUSAL_LM",
    )
    try:
        with quiet_peft():
            return get_peft_model(model, config)
    except ValueError as err:  # e.g. "Target modules {...} not found in the base model"
        raise GrpoError(f"model.lora.target_modules={asked}: {err}") from err
