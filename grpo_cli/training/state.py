"""TrainState: every piece of state a resume needs beyond weights, optimizer and scheduler, by name.

A stateful part (the RNGs, the prompt sampler, the reward fusion; later clip, guards, curriculum)
registers once; checkpoints save it and the step-start snapshot a Ctrl-C rolls back to is it.
"""

from __future__ import annotations

import copy
import random
from typing import Any, Protocol

import torch


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def seed_everything(seed: int) -> None:
    """Called at the start of every job: a multirun runs all jobs in one process."""
    random.seed(seed)
    torch.manual_seed(seed)


class RngState:
    """torch (CPU and CUDA) and Python RNGs: a resumed run samples what the straight run sampled.
    vLLM's engine stream is not here (it cannot be saved): the trainer seeds each step's requests
    instead (`Generator.set_step_seed`, `rollout.vllm.request_seeds`)."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python": random.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if state["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        random.setstate(state["python"])


class TrainState:
    """Named parts; `state_dict()` is a deep copy, so a snapshot does not move with the live run."""

    def __init__(self) -> None:
        self._parts: dict[str, Stateful] = {}

    def register(self, name: str, part: Stateful) -> None:
        if name in self._parts:
            raise ValueError(f"train state part {name!r} registered twice")
        self._parts[name] = part

    def state_dict(self) -> dict[str, Any]:
        return {name: copy.deepcopy(part.state_dict()) for name, part in self._parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = sorted(set(self._parts) - set(state))
        if missing:
            raise ValueError(f"checkpoint state lacks {missing} (it has {sorted(state)})")
        for name, part in self._parts.items():
            part.load_state_dict(state[name])
