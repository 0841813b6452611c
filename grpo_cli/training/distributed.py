"""Data-parallel training on accelerate: N processes, one update.

Each process generates and scores its own share of a step's prompts (whole groups), then
everything the maths reads across the batch is shared: the reward functions' raw scores are
gathered, so every process fuses, normalises and computes advantages on the global batch (the
same statistics and the same running state everywhere); loss denominators and reported figures
are summed (`core.update.Collective`); gradients are averaged by DistributedDataParallel (through
`Accelerator.prepare_model`). The update is therefore the one a single process computes on the
global batch. Only the main process writes files, logs and trackers (docs/scaling.md).

The processes come from accelerate's launcher (torchrun underneath), started by `grpo train
distributed.num_processes=N` or by the user's own `accelerate launch`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any, TypeVar

import torch

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import BatchScores, concat_scores
from grpo_cli.rollout.base import Rollout, concat_rollouts

T = TypeVar("T")


def launched_processes() -> int:
    """Processes of the launch this process belongs to (1 outside a distributed launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class World:
    """This process's place among the training processes, and the collectives the step needs.

    `World.single()` is the one-process world: every collective is the identity and nothing
    imports torch.distributed's process group."""

    def __init__(self, rank: int = 0, size: int = 1, device: torch.device | None = None) -> None:
        self.rank, self.size, self.device = rank, size, device

    @classmethod
    def single(cls) -> World:
        return cls()

    @classmethod
    def join(cls, cpu: bool) -> World:
        """Join the launch's process group through accelerate (gloo on CPU, nccl on CUDA)."""
        from accelerate import PartialState

        state = PartialState(cpu=cpu)
        return cls(state.process_index, state.num_processes, state.device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- the batch ---------------------------------------------------------------------
    def share(self, items: list[T]) -> list[T]:
        """This process's contiguous share of a step's prompts (the count divides evenly)."""
        per = len(items) // self.size
        return items[self.rank * per : (self.rank + 1) * per]

    def rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """This process's rows of a global-batch tensor (its prompts' groups, in order)."""
        per = tensor.size(0) // self.size
        return tensor[self.rank * per : (self.rank + 1) * per]

    def sampling_seed(self, seed: int, step: int) -> int:
        """Each process samples its own completions; a function of (seed, step, rank), so a resumed
        run draws what an uninterrupted one would without saving every process's RNG state."""
        return (seed * 1_000_003 + step * 7_919 + self.rank) % (2**63 - 1)

    # ---- collectives -------------------------------------------------------------------
    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the processes (core.update.Collective)."""
        if self.size == 1:
            return values
        from accelerate.utils import reduce

        return reduce(values.to(self.device), reduction="sum").to(values.device)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """core.parallel.Collective.gather: each process's 1-D values, concatenated in rank order."""
        if self.size == 1:
            return values
        return torch.cat([part.to(values.device) for part in self.gather_objects(values.detach().cpu())])

    def gather_objects(self, value: Any) -> list[Any]:
        """Every process's `value`, in process order (pickled: small things only)."""
        if self.size == 1:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out

    def gather_scores(self, scores: dict[str, BatchScores]) -> dict[str, BatchScores]:
        """The global batch's raw scores, per function, as one process scoring the whole batch would
        have them: values, rows raised on and rows missing a column in process order, the first error
        any process saw (failure isolation must count the same failures everywhere)."""
        if self.size == 1:
            return scores
        return concat_scores(self.gather_objects(scores), concurrent=True)

    def gather_rollout(self, rollout: Rollout, pad_token_id: int) -> Rollout:
        """The global batch's rollout, for metrics and the completion log of the main process."""
        if self.size == 1:
            return rollout
        parts = self.gather_objects({k: v.cpu() if torch.is_tensor(v) else v for k, v in vars(rollout).items()})
        return concat_rollouts([Rollout(**part) for part in parts], pad_token_id)

    def broadcast(self, value: Any) -> Any:
        """The main process's `value`, in every process (pickled)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier()

    def leave(self) -> None:
        """End a finished run's process group in step: each process waits for the others, then tears
        its group down itself. A process that exits with its gloo group alive can abort in the C++
        teardown ("terminate called without an active exception") after the run is done, and its
        launcher then reports the finished run as failed."""
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. builds and saves the tiny model), the others
        after it: they read what it wrote instead of racing it."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def check_divisible(prompts_per_step: int, processes: int) -> None:
    """Every process takes whole groups, the same number of them."""
    if processes > 1 and prompts_per_step % processes:
        raise GrpoError(
            f"train.prompts_per_step={prompts_per_step} does not split over {processes} processes: each process "
            f"generates whole groups for an equal share; use a multiple of {processes}, e.g. "
            f"{math.ceil(prompts_per_step / processes) * processes}"
        )


SHARDED = ("FSDP", "DEEPSPEED", "MEGATRON_LM")  # accelerate distributed types that shard the weights


def data_parallel_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The policy wrapped for the update by accelerate (DistributedDataParallel: each process
    keeps whole weights and gradients are averaged). An accelerate config asking for FSDP or
    DeepSpeed is refused: accelerate would shard the very module that samples; sharding is
    distributed.strategy=fsdp, which shards a copy for the update (training.sharding)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=device.type == "cpu")
    kind = accelerator.distributed_type.name
    if kind in SHARDED:
        raise GrpoError(
            f"the accelerate config asks for {kind}; grpo shards the weights itself: keep distributed_type "
            "MULTI_GPU in the accelerate config (recipes/accelerate/multi_gpu.yaml) and add "
            "distributed.strategy=fsdp (torch's FSDP2: each process holds 1/N of the trained weights, "
            "gradients and optimizer state; docs/scaling.md#sharded-training)"
        )
    return accelerator.prepare_model(model)
