"""train.empty_cache_every (TRL's torch_empty_cache_steps): the device's cached, unused memory goes
back to it after every N-th finished step, and once more when the run's models are freed.

A CPU has no caching allocator, so the test gives `torch.cpu` the `empty_cache` that `torch.cuda`
has, and records the step the trainer had finished when it was called: the trainer's own call
through the helper it uses on every device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_cli.training import GRPOTrainer
from tests.training.test_trainer import small_config


def calls_after_steps(every: int, steps: int, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The finished step at each call; None for the call after the models were freed."""
    trainer = GRPOTrainer(small_config(steps=steps, empty_cache_every=every), run_dir)
    seen: list[int | None] = []
    monkeypatch.setattr(
        torch.cpu,
        "empty_cache",
        lambda: seen.append(trainer.step_index if hasattr(trainer, "model") else None),
        raising=False,
    )
    trainer.setup()
    try:
        trainer.train()
    finally:
        trainer.cleanup()
    return seen


def test_the_cache_is_emptied_after_every_nth_step_and_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert calls_after_steps(2, 5, tmp_path / "every_2", monkeypatch) == [2, 4, None]


def test_zero_never_empties_it_during_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert calls_after_steps(0, 3, tmp_path / "never", monkeypatch) == [None]
