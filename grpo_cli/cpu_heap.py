"""Freed memory kept in the process for the next step's tensors (`train.cpu_heap`).

glibc serves every allocation over its mmap threshold (at most 32 MiB) with a fresh mapping and
unmaps it when the tensor is freed, so each training step faults its large tensors in again, page
by page: the dense embedding gradient, a logit chunk, the packed attention mask. On SmolLM2-135M
(the vs-TRL workload, a 2-core AVX512 CPU) those page faults were about a fifth of a step (4.0 s
with glibc's defaults, 3.35 s without the mmaps; docs/benchmarks.md "The page faults"). With mmap
off and the trim threshold at its largest, freed memory stays in the heap and the next allocation of
the same size reuses it: peak RSS rose 3% there. PyTorch's own CPU launcher gets the same effect by
preloading jemalloc or tcmalloc; this needs no other library.

A process-wide setting: the first trainer that takes it sets it for the rest of the process.
"""

from __future__ import annotations

import ctypes
import platform

import torch

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
KEEP_BYTES = 2**31 - 1  # the largest trim threshold mallopt takes (an int): free memory at the heap's top stays

_taken: list[str] = []  # the words of the first call that changed the process


def keep_freed_memory(setting: str, device: torch.device) -> str | None:
    """Apply `train.cpu_heap` and return the start-up words for it; None where it does not apply
    (a run on an accelerator allocates its large tensors there, not from glibc)."""
    if setting == "system":
        return "the system allocator's defaults (train.cpu_heap=system)"
    if device.type != "cpu":
        return None
    if _taken:
        return _taken[0]
    if platform.libc_ver()[0] != "glibc":
        return "the system allocator's defaults (train.cpu_heap=auto changes glibc only; this is not glibc)"
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)):
        return "the system allocator's defaults (glibc refused mallopt)"
    _taken.append("kept in the process for reuse (train.cpu_heap=auto: glibc's mmap and trim off)")
    return _taken[0]
