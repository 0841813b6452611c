"""Compute dtypes: fp32 weights with bf16 autocast, or weights loaded in the dtype itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from grpo_cli.config.schema import PrecisionConfig

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_factory(
    device: torch.device, precision: PrecisionConfig
) -> Callable[[], contextlib.AbstractContextManager]:
    """A fresh autocast context per forward pass (contexts are single-use), or a no-op."""
    if not precision.autocast or precision.dtype == "fp32":
        return contextlib.nullcontext
    dtype = PRECISION_DTYPES[precision.dtype]
    return lambda: torch.autocast(device.type, dtype=dtype)


def weights_dtype(precision: PrecisionConfig) -> str:
    """Under autocast the master weights stay fp32; otherwise they are loaded in the compute dtype."""
    return "fp32" if precision.autocast else precision.dtype


def effective_precision(precision: PrecisionConfig, device: torch.device) -> tuple[PrecisionConfig, str | None]:
    """The precision a run can have on `device`, and a one-line notice when it differs.

    fp16 autocast with a gradient scaler is a CUDA recipe: a CPU has no fp16 matmul worth having
    and autocast there would only lose precision, so it runs in fp32 instead.
    """
    if precision.dtype == "fp16" and device.type != "cuda":
        notice = f"precision=fp16 needs CUDA; on {device.type} this run uses fp32 (no autocast, no gradient scaler)"
        return PrecisionConfig(dtype="fp32", autocast=False, grad_scaler=False), notice
    return precision, None


def gradient_scaler(precision: PrecisionConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """A dynamic loss scaler for fp16 autocast on CUDA (its state goes into checkpoints); else None."""
    if precision.dtype == "fp16" and precision.autocast and precision.grad_scaler and device.type == "cuda":
        return torch.amp.GradScaler(device.type)
    return None
