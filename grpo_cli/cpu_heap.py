"""Freed memory kept in the process for the next step's tensors (`train.cpu_heap`).

glibc serves every allocation over its mmap threshold (at most 32 MiB) with a fresh mapping and
unmaps it when the tensor is freed, so each training step faults its large tensors in again, page
by page: the dense embedding gradient, a logit chunk, the packed attention mask. On SmolLM2-135M
(the vs-TRL workload, a 2-core AVX512 CPU) those page faults were about a sixth of a step (4.0 s
with glibc's defaults, 3.35 s without the mmaps; docs/benchmarks.md "The page faults"). With mmap
off and the trim threshold at its largest, freed memory stays in the heap and the next allocation of
the same size reuses it: over 20 steps peak RSS rose 8% there (4.7 to 5.1 GB). PyTorch's own CPU
launcher gets the same effect by preloading jemalloc or tcmalloc; this needs no other library.

The step's transient tensors vary in size with the completions, so holes between them make the
heap creep up (SmolLM2, 60 steps: the heap's free bytes went from 1.5 to 2.8 GB next to 2.0-2.5 GB
in use). `trim_kept_memory`, called after every step, gives the free pages back once the resident
size passes a quarter above what it was after the second step (or after the last trim); the next
step faults them in once more, as it would every step without this.

A process-wide setting: the first trainer that takes `auto` sets it for the process, and a later
`system` job of the same process (a sweep) puts glibc's mmap and trim back to their defaults.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

import torch

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_MMAP_MAX = 65536  # glibc's defaults (malloc.c), what `system` after `auto` restores
DEFAULT_TRIM_BYTES = 128 * 1024
KEEP_BYTES = 2**31 - 1  # the largest trim threshold mallopt takes (an int): free memory at the heap's top stays

SLACK = 1.25  # the resident size, as a multiple of the settled one, past which kept memory goes back
SETTLED_AFTER = 2  # steps before the resident size is taken as the settled one (the first ones load and warm up)

_taken: list[str] = []  # the words of the first call that changed the process
_budget = {"calls": 0, "bytes": 0}  # trim_kept_memory's count of calls and its resident-size bound


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library this process runs on (glibc where `keep_freed_memory` takes effect)."""
    return ctypes.CDLL(None)


def keep_freed_memory(setting: str, device: torch.device) -> str | None:
    """Apply `train.cpu_heap` and return the start-up words for it; None where it does not apply
    (a run on an accelerator allocates its large tensors there, not from glibc)."""
    if setting == "system":
        return _restore_defaults() or "the system allocator's defaults (train.cpu_heap=system)"
    if device.type != "cpu":
        return None
    _budget.update(calls=0, bytes=0)  # each trainer's own steps settle the bound (a sweep runs several)
    if _taken:
        return _taken[0]
    if platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/statm"):
        return "the system allocator's defaults (train.cpu_heap=auto changes glibc on Linux only)"
    if not (_libc().mallopt(M_MMAP_MAX, 0) and _libc().mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)):
        return "the system allocator's defaults (glibc refused mallopt)"
    _taken.append("kept in the process for reuse (train.cpu_heap=auto: glibc's mmap and trim off)")
    return _taken[0]


def _restore_defaults() -> str | None:
    """Undo an earlier `auto` job of this process; the words for it, or None when nothing changed.
    glibc then keeps its mmap threshold fixed where it was (a set trim threshold ends its sliding)."""
    if not _taken:
        return None
    _taken.clear()
    if not (_libc().mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX) and _libc().mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_BYTES)):
        return "glibc as an earlier train.cpu_heap=auto job left it: it refused mallopt (train.cpu_heap=system)"
    return "the system allocator's defaults, restored after an earlier train.cpu_heap=auto job (train.cpu_heap=system)"


def resident_bytes() -> int:
    """This process's resident set size now (Linux's /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_kept_memory() -> bool:
    """After a step: give the heap's free pages back to the system when the resident size has grown
    past SLACK times its settled value (module docstring); True when it did."""
    if not _taken:
        return False
    _budget["calls"] += 1
    rss = resident_bytes()
    if _budget["calls"] <= SETTLED_AFTER:
        _budget["bytes"] = int(rss * SLACK)
        return False
    if rss <= _budget["bytes"]:
        return False
    _libc().malloc_trim(0)
    _budget["bytes"] = max(_budget["bytes"], int(resident_bytes() * SLACK))
    return True
