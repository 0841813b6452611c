"""fp16's gradient scaler inside policy_update (checked on the CPU: the bookkeeping is the same as
on CUDA), and the CPU fallback of precision=fp16."""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, PrecisionConfig, TrainConfig
from grpo_cli.core.precision import effective_precision, gradient_scaler
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, policy_update
from grpo_cli.training import GRPOTrainer
from tests.core.conftest import advantages_for, flat

FP16 = PrecisionConfig(dtype="fp16", autocast=True, grad_scaler=True)


def update(model, rollout, advantages, scaler):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    torch.manual_seed(1)
    return policy_update(
        Learner(model, opt, sched, scaler=scaler),
        UpdateBatch(rollout, advantages, rollout.completion_mask.float()),
        AlgoConfig(),
        UpdateSettings(1.0, 6, 2, 1.0, "padded"),
    )


def test_a_scaled_update_equals_the_unscaled_one(base_model, rollout) -> None:
    plain, scaled = copy.deepcopy(base_model), copy.deepcopy(base_model)
    adv = advantages_for(rollout)
    a = update(plain, rollout, adv, None)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    b = update(scaled, rollout, adv, scaler)
    assert torch.allclose(flat(plain), flat(scaled), atol=1e-6)  # unscaled before clipping and stepping
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    assert scaler.get_scale() == 2.0**11  # a clean step grows the scale (growth_interval=1)


def test_an_overflowing_step_is_skipped_and_halves_the_scale(base_model, rollout) -> None:
    model = copy.deepcopy(base_model)
    before = flat(model).clone()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    stats = update(model, rollout, torch.full_like(advantages_for(rollout), math.nan), scaler)
    assert stats.skipped_updates == 1 and stats.optimizer_steps == 0
    assert torch.equal(flat(model), before)
    assert scaler.get_scale() == 2.0**9


def test_fp16_on_a_cpu_falls_back_to_fp32_with_a_notice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert effective_precision(FP16, torch.device("cpu"))[0] == PrecisionConfig()
    assert gradient_scaler(FP16, torch.device("cpu")) is None
    cfg = TrainConfig()
    cfg.precision = copy.deepcopy(FP16)
    cfg.train.device = "cpu"
    trainer = GRPOTrainer(cfg, tmp_path)
    with caplog.at_level(logging.WARNING, logger="grpo"):
        trainer.setup()
    assert [r.message for r in caplog.records if "fp16" in r.message] == [
        "precision=fp16 needs CUDA; on cpu this run uses fp32 (no autocast, no gradient scaler)"
    ]
    assert trainer.learner.scaler is None and next(trainer.model.parameters()).dtype == torch.float32
    trainer.cleanup()
