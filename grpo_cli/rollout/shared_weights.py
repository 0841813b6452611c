"""The trainer's side of the vLLM weight push: one shared-memory file the policy's weights are
written into and the engine's workers map (`vllm_worker.WeightSyncExtension`).

A file, not `collective_rpc` arguments: vLLM serialises tensor arguments as nested lists, far
slower than the step for a real model; and not CUDA IPC, which a CPU engine has not. The file
lives in /dev/shm (memory, not disk) where there is one, keeps its size from push to push (so the
workers map it once), and is removed when the generator closes or the process exits.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

from grpo_cli.rollout.vllm_worker import Slot

ALIGN = 64  # byte alignment of every tensor in the file (a cache line; every dtype's size divides it)


def shared_memory_dir() -> str:
    """/dev/shm where the system has it (Linux), else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class SharedWeights:
    """Writes (name, tensor) pairs into the file and returns their layout; grows the file when a
    push needs more room (a new size is remapped by the workers once)."""

    def __init__(self, directory: str | None = None) -> None:
        directory = directory or shared_memory_dir()
        handle, name = tempfile.mkstemp(prefix=f"grpo-weights-{os.getpid()}-", suffix=".bin", dir=directory)
        os.close(handle)
        self.path = Path(name)
        self.nbytes = 0
        self.storage: torch.UntypedStorage | None = None
        atexit.register(self.close)

    def write(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[Slot]:
        """Copy each tensor into the file, one at a time (a merged LoRA weight exists only while it
        is copied); its layout for the workers."""
        layout: list[Slot] = []
        offset = 0
        for name, tensor in weights:
            size = tensor.numel() * tensor.element_size()
            self._reserve(offset + size)
            view = self._view(offset, tensor.dtype, tensor.numel()).view(tensor.shape)
            view.copy_(tensor.detach())
            layout.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset))
            offset += -(-size // ALIGN) * ALIGN
        return layout

    def _reserve(self, nbytes: int) -> None:
        if nbytes <= self.nbytes:
            return
        # exactly: a mapping costs nothing until touched, and what was written stays in the file. The
        # file is sized here: torch's from_file, left to extend it, rewrites its first bytes
        os.truncate(self.path, nbytes)
        self.storage = torch.UntypedStorage.from_file(str(self.path), shared=True, nbytes=nbytes)
        self.nbytes = nbytes

    def _view(self, offset: int, dtype: torch.dtype, count: int) -> torch.Tensor:
        flat = torch.empty(0, dtype=dtype)
        flat.set_(self.storage, offset // flat.element_size(), (count,))
        return flat

    def close(self) -> None:
        self.storage = None
        self.path.unlink(missing_ok=True)
