"""What the update needs from data parallelism, declared here so the maths does not depend on
how processes talk (training.distributed.World implements it over torch.distributed)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch.nn.parallel import DistributedDataParallel


class Collective(Protocol):
    """The sums a data-parallel update needs across its processes: loss denominators and reported
    figures must count the global batch, not one process's share."""

    size: int  # processes; a wrapped model's gradients are averaged over them

    def sum(self, values: torch.Tensor) -> torch.Tensor: ...

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every process's 1-D `values`, concatenated in process order (lengths may differ): a
        quantile over the global batch (algo.top_entropy_quantile)."""
        ...


class SingleProcess:
    """One process: every sum is the local value."""

    size = 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return values


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper: its config, and passes without gradients."""
    return model.module if isinstance(model, DistributedDataParallel) else model
