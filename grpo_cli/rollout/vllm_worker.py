"""The engine's side of the weight push: methods vLLM mixes into its worker class
(`LLM(worker_extension_cls=WORKER_EXTENSION)`) and `LLM.collective_rpc` calls by name, in every
worker, whether the engine core runs in this process or in a child.

Why not `model.load_weights` on the driver worker, as vLLM 0.8-0.11 allowed: vLLM post-processes
weights after loading them (on a CPU it packs every linear weight into a oneDNN or sgl-kernel copy
and samples from that copy), so a plain load changes the parameters and not what is sampled.
`Worker.reload_weights` re-runs that processing for what it loads; a weight that was kept unpacked
beside its packed copy (the tied LM head of SmolLM2-class models) is not reloaded by it and is
repacked here. Why not `LLM.apply_model(lambda)`: with the engine core in a child process the
callable is pickled, and a closure cannot be.

The weights travel through one shared-memory file (`SharedWeights` on the trainer's side), mapped
once per size: `collective_rpc` serialises tensor arguments as nested lists, which for 135M
parameters takes longer than the step. Kept free of grpo imports: it is imported inside vLLM's
worker process.

A server started with `vllm serve` (`rollout.vllm.mode=server`, `vllm_server`) reaches the same
reload through its `/collective_rpc` endpoint, which passes strings: `grpo_load_pushed_weights`
takes one JSON request, maps the trainer's file when this host sees it (same machine) and else
pulls the bytes over HTTP from the listener the trainer opened (another host, no NCCL needed).
Each load records the policy version it carries; `grpo_weights_version` reports it, and a
restarted server (its weights the model directory's again) reports None, so the trainer pushes
before it samples.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator, Sequence

import torch

# what `LLM(worker_extension_cls=...)` is given: vLLM wants the dotted path, not module:Class
WORKER_EXTENSION = "grpo_cli.rollout.vllm_worker.WeightSyncExtension"

Slot = tuple[str, str, list[int], int]  # (checkpoint name, dtype name, shape, byte offset) in the file


def tensor_views(storage: torch.UntypedStorage, layout: Sequence[Slot]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the mapped file, laid out as `SharedWeights.write` wrote them."""
    for name, dtype_name, shape, offset in layout:
        dtype = getattr(torch, dtype_name)
        count = 1
        for size in shape:
            count *= size
        flat = torch.empty(0, dtype=dtype)
        flat.set_(storage, offset // flat.element_size(), (count,))
        yield name, flat.view(shape)


def repack_kept_weights(model: torch.nn.Module) -> int:
    """Re-run the post-load processing of every layer that still holds a whole 2-D weight beside a
    processed copy (vLLM-CPU keeps an embedding's weight and packs a copy for the tied LM head;
    `reload_weights` reprocesses only the layers it loaded). How many layers it repacked; 0 on a
    GPU, where no layer has a `cpu_linear`."""
    repacked = 0
    for module in model.modules():
        method, weight = getattr(module, "quant_method", None), getattr(module, "weight", None)
        if not hasattr(module, "cpu_linear") or method is None or not isinstance(weight, torch.Tensor):
            continue
        if weight.ndim == 2 and weight.numel() > 0:
            method.process_weights_after_loading(module)
            repacked += 1
    return repacked


PULL_CHUNK = 1 << 24  # bytes read per call while pulling the weights over HTTP


def pulled_storage(url: str, nbytes: int, timeout: float, buffer: bytearray | None = None) -> bytearray:
    """The `nbytes` the trainer's listener serves at `url`, read into `buffer` (reused when its size
    fits: the push's size rarely changes). Raises on a short read, so a cut transfer never loads."""
    buffer = buffer if buffer is not None and len(buffer) == nbytes else bytearray(nbytes)
    view, done = memoryview(buffer), 0
    with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (the trainer's own http:// URL)
        while done < nbytes:
            read = reply.readinto(view[done : done + PULL_CHUNK])
            if not read:
                raise ConnectionError(f"the weights at {url} ended after {done} of {nbytes} bytes")
            done += read
    return buffer


class WeightSyncExtension:
    """Mixed into vLLM's `Worker` (so `self.reload_weights` and `self.model_runner` are vLLM's)."""

    _grpo_mapped: tuple[str, int, torch.UntypedStorage] | None = None
    _grpo_pulled: bytearray | None = None  # the last pull's bytes, reused by the next of the same size
    _grpo_version: str | None = None  # the policy version pushed last; None: the model directory's weights

    def grpo_load_shared_weights(self, path: str, nbytes: int, layout: list[Slot]) -> dict[str, int]:
        """Load the weights `layout` names from the shared file into the engine's model, through
        vLLM's reload (post-processing included); what was loaded, for the caller to check."""
        if self._grpo_mapped is None or self._grpo_mapped[:2] != (path, nbytes):
            self._grpo_mapped = (path, nbytes, torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes))
        return self._grpo_reload(self._grpo_mapped[2], layout)

    def grpo_load_pushed_weights(self, request: str) -> dict[str, object]:
        """Server mode: load a push described by a JSON object (path, nbytes, url, layout, version,
        transfer, timeout), from the file where this host has it, else over HTTP from `url`."""
        push = json.loads(request)
        path, nbytes = push["path"], push["nbytes"]
        self._grpo_version = None  # until loaded whole: a load cut halfway holds no version's weights
        same_host = os.path.isfile(path) and os.path.getsize(path) >= nbytes
        if push["transfer"] == "file" and not same_host:  # mapping a missing path would create it: zeros
            raise FileNotFoundError(f"rollout.vllm.transfer=file: this host has no {path}; use auto or http")
        if push["transfer"] != "http" and same_host:
            loaded = self.grpo_load_shared_weights(path, nbytes, push["layout"])
            via = "file"
        else:
            self._grpo_pulled = pulled_storage(push["url"], nbytes, push["timeout"], self._grpo_pulled)
            storage = torch.frombuffer(self._grpo_pulled, dtype=torch.uint8).untyped_storage()
            loaded = self._grpo_reload(storage, push["layout"])
            via = "http"
        self._grpo_version = push["version"]
        return {**loaded, "via": via, "version": self._grpo_version}

    def grpo_weights_version(self) -> str | None:
        """The policy version this worker's weights are (None: the model directory's, as started)."""
        return self._grpo_version

    def _grpo_reload(self, storage: torch.UntypedStorage, layout: Sequence[Slot]) -> dict[str, int]:
        self.reload_weights(weights_iterator=tensor_views(storage, layout))  # type: ignore[attr-defined]
        repacked = repack_kept_weights(self.model_runner.get_model())  # type: ignore[attr-defined]
        return {"tensors": len(layout), "repacked": repacked}
