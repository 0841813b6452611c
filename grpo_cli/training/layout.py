"""What the update's forward passes compute for this model, decided once at start-up from the model
itself: the layout (`train.layout`: packed only where a probe proved it equal to padded) and the
router's auxiliary loss (`algo.router_aux_loss_coef`, TRL's semantics)."""

from __future__ import annotations

from typing import Any

import torch

from grpo_cli.core.logprobs import packed_unsupported
from grpo_cli.core.parallel import unwrap
from grpo_cli.errors import GrpoError


def text_config(model: torch.nn.Module) -> Any:
    """The decoder's config (a multimodal model's text part); a PEFT wrapper forwards `config`."""
    config = unwrap(model).config
    return config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config


def router_aux_coefficient(setting: float | None, model: torch.nn.Module) -> float:
    """algo.router_aux_loss_coef for this model, as TRL resolves it: null takes the coefficient the
    model's config declares (0 where it declares none, as DeepSeek-V3, which balances its experts
    without a loss); a coefficient is only for a model whose forward returns router logits."""
    config = text_config(model)
    routed = hasattr(config, "output_router_logits")  # a mixture-of-experts model's config has it
    if setting is None:
        return float(getattr(config, "router_aux_loss_coef", None) or 0.0) if routed else 0.0
    if setting > 0 and not routed:
        raise GrpoError(
            f"algo.router_aux_loss_coef={setting:g}: {type(unwrap(model)).__name__} is not a mixture-of-experts "
            "model (its config has no output_router_logits); leave it null or 0"
        )
    return float(setting)


def training_layout(setting: str, model: torch.nn.Module, router_aux_loss_coef: float) -> tuple[str, str]:
    """(the layout the update runs, the start-up words saying which and why). `packed` is offered
    where `core.logprobs.packed_unsupported` finds no reason against it; the router's auxiliary loss
    keeps the padded rows, over which the model (and TRL) computes it. `auto` then picks padded;
    `packed` fails naming the reason."""
    if setting == "padded":
        return "padded", "padded (train.layout=padded)"
    if router_aux_loss_coef > 0:
        reason = (
            f"the router's auxiliary loss (algo.router_aux_loss_coef={router_aux_loss_coef:g}) is computed over "
            "padded rows, as TRL computes it"
        )
    else:
        reason = packed_unsupported(model)
    if reason is None:
        return setting, "packed" if setting == "packed" else "auto: packed where it costs less than padded"
    if setting == "packed":
        raise GrpoError(f"train.layout=packed cannot train this model: {reason}; use train.layout=auto or padded")
    return "padded", f"padded ({reason})"
