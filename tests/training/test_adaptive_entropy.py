"""`algo.adaptive_entropy` in the trainer (issue 38): the coefficient moves once per optimizer step,
is logged as `entropy/coef`, is saved in the checkpoint and comes back from it, so a run interrupted
and resumed continues the uninterrupted run's coefficients and updates exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_cli.checkpoint import TRAINING_STATE
from grpo_cli.config.schema import TrainConfig
from tests.conftest import read_metrics, reproducible
from tests.training.test_trainer import InterruptAt, run, small_config


def config() -> TrainConfig:
    """The tiny model's entropy (about 5.5 nats) is below a target of 100: the coefficient rises by
    0.01 at every optimizer step and is applied from the second step on (none measured before)."""
    cfg = small_config(steps=5)
    cfg.algo.entropy_coef = 0.02
    cfg.algo.mini_batches = 2  # two optimizer steps per training step: two moves per metrics line
    cfg.algo.adaptive_entropy.enabled = True
    cfg.algo.adaptive_entropy.target, cfg.algo.adaptive_entropy.coef_delta = 100.0, 0.01
    return cfg


def test_the_coefficient_moves_each_optimizer_step_and_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    straight = run(config(), tmp_path / "straight")
    rows = read_metrics(tmp_path / "straight")
    assert [row["entropy/coef"] for row in rows] == pytest.approx([0.04, 0.06, 0.08, 0.10, 0.12])
    assert 0 < straight.entropy.last_entropy < 100  # the last optimizer step's kept tokens, at or below the target

    with pytest.raises(KeyboardInterrupt):
        run(config(), tmp_path / "resumed", InterruptAt(3))
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "step_000003" / TRAINING_STATE, weights_only=False)
    assert saved["state"]["entropy"]["coef"] == pytest.approx(0.08)
    resumed = run(config(), tmp_path / "resumed")  # train.resume=auto
    assert reproducible(read_metrics(tmp_path / "resumed")) == reproducible(rows)
    assert resumed.entropy.state_dict() == straight.entropy.state_dict()  # the loss and grad_norm lines matched too


def test_a_run_without_it_keeps_the_checkpoint_it_always_had(tmp_path: Path) -> None:
    """Registered only while enabled: a checkpoint written before the key existed still resumes."""
    run(small_config(steps=1, save_every=1), tmp_path)
    saved = torch.load(tmp_path / "checkpoints" / "step_000001" / TRAINING_STATE, weights_only=False)
    assert "entropy" not in saved["state"]
    assert "entropy/coef" not in read_metrics(tmp_path)[0]
