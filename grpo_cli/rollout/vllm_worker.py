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
"""

from __future__ import annotations

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


class WeightSyncExtension:
    """Mixed into vLLM's `Worker` (so `self.reload_weights` and `self.model_runner` are vLLM's)."""

    _grpo_mapped: tuple[str, int, torch.UntypedStorage] | None = None

    def grpo_load_shared_weights(self, path: str, nbytes: int, layout: list[Slot]) -> dict[str, int]:
        """Load the weights `layout` names from the shared file into the engine's model, through
        vLLM's reload (post-processing included); what was loaded, for the caller to check."""
        if self._grpo_mapped is None or self._grpo_mapped[:2] != (path, nbytes):
            self._grpo_mapped = (path, nbytes, torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes))
        storage = self._grpo_mapped[2]
        self.reload_weights(weights_iterator=tensor_views(storage, layout))  # type: ignore[attr-defined]
        repacked = repack_kept_weights(self.model_runner.get_model())  # type: ignore[attr-defined]
        return {"tensors": len(layout), "repacked": repacked}
