"""What a step costs in memory: the figure a user sizes the next run by."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_mib(device: torch.device) -> float:
    """Peak since the process started: CUDA memory allocated by tensors on a GPU (what OOMs),
    the process's peak resident set otherwise (weights, activations and everything else)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux
