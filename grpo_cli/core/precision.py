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
