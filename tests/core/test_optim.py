"""Learning-rate scaling (docs/architecture.md §3, seed 001): lr_eff = lr·sqrt(B/B_ref) or lr·B/B_ref, B the
completions per optimizer step; build_optimizer builds AdamW at that lr. Worked numbers."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_cli.config.schema import OptimConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.core.optim import build_optimizer, completions_per_step, effective_lr, schedule_at
from grpo_cli.errors import GrpoError


def optim(**kwargs):
    return OptimConfig(**{"lr": 1e-6, "reference_batch": 32, "warmup_steps": 0, **kwargs})


def test_batch_is_completions_per_optimizer_step():
    """16 prompts × 8 completions = 128 per rollout; 4 mini-batches -> 4 optimizer steps of 32."""
    assert completions_per_step(16, 8, 1) == 128
    assert completions_per_step(16, 8, 4) == 32
    assert completions_per_step(6, 4, 4) == 6  # 24 completions over 4 steps: 6 on average


def test_sqrt_scaling():
    """B 128 over B_ref 32: ×√4 = ×2; B 8: ×√(1/4) = ×0.5; B = B_ref: unchanged."""
    assert effective_lr(optim(lr_scaling="sqrt"), 128) == pytest.approx(2e-6)
    assert effective_lr(optim(lr_scaling="sqrt"), 8) == pytest.approx(5e-7)
    assert effective_lr(optim(lr_scaling="sqrt"), 32) == pytest.approx(1e-6)


def test_linear_scaling():
    """B 128 over B_ref 32: ×4; B 8: ×0.25."""
    assert effective_lr(optim(lr_scaling="linear"), 128) == pytest.approx(4e-6)
    assert effective_lr(optim(lr_scaling="linear"), 8) == pytest.approx(2.5e-7)


def test_none_keeps_lr_whatever_the_batch():
    assert effective_lr(optim(lr_scaling="none", reference_batch=0), 128) == 1e-6


def test_scaling_without_a_reference_batch_is_refused():
    with pytest.raises(GrpoError, match=r"optim.reference_batch > 0"):
        effective_lr(optim(lr_scaling="sqrt", reference_batch=0), 128)
    with pytest.raises(GrpoError, match=r"optim.reference_batch=0: optim.lr_scaling=sqrt needs the completions"):
        validate(TrainConfig(optim=OptimConfig(lr_scaling="sqrt")))
    with pytest.raises(
        GrpoError, match=r"optim.lr_scaling='sqr': must be one of none, sqrt, linear; did you mean sqrt"
    ):
        validate(TrainConfig(optim=OptimConfig(lr_scaling="sqr", reference_batch=32)))
    assert validate(TrainConfig(optim=OptimConfig(lr_scaling="linear", reference_batch=32))) == []


@pytest.mark.parametrize(("scaling", "expected"), [("sqrt", 2e-6), ("linear", 4e-6), ("none", 1e-6)])
def test_build_optimizer_uses_the_effective_lr(scaling, expected):
    """The default run's shape: 16 prompts × 8 completions, one mini-batch -> B 128."""
    cfg = TrainConfig(optim=optim(lr_scaling=scaling))
    batch = completions_per_step(cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.algo.mini_batches)
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 1), cfg.optim, 10, batch)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert scheduler.base_lrs == pytest.approx([expected])  # the schedule decays from it


def test_build_optimizer_keeps_its_schedule_and_needs_the_batch_only_when_scaling():
    """warmup 5 of a constant schedule: step 0 at 0, then lr_eff·k/5."""
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 1), optim(lr_scaling="sqrt", warmup_steps=5), 10, 128)
    assert optimizer.param_groups[0]["lr"] == 0.0
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-6 / 5)
    plain, _ = build_optimizer(torch.nn.Linear(2, 1), optim(), 10)  # lr_scaling none: B may be left out
    assert plain.param_groups[0]["lr"] == 1e-6
    with pytest.raises(GrpoError, match=r"optim.lr_scaling=sqrt: build_optimizer needs the completions"):
        build_optimizer(torch.nn.Linear(2, 1), optim(lr_scaling="sqrt"), 10)


def test_the_optimizer_is_torchs_fused_adamw_and_steps_as_the_per_tensor_loop_does():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    twin.load_state_dict(model.state_dict())
    cfg = optim(lr=1e-2, weight_decay=0.1)
    fused, _ = build_optimizer(model, cfg, total_optimizer_steps=10)
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(twin.parameters(), lr=1e-2, betas=tuple(cfg.betas), weight_decay=0.1, fused=False)
    x = torch.randn(32, 8)
    for _ in range(5):
        for net, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scheduler", ["constant", "linear", "cosine"])
def test_schedule_at_a_position_is_the_lr_stepping_reaches_there(scheduler):
    """Warmup 3 of 12 steps: moving the schedule to any position, forwards or back, gives the lr that
    stepping from the start reaches at that position, without torch's optimizer-order warning."""
    stepped_optimizer, stepped = build_optimizer(torch.nn.Linear(2, 1), optim(scheduler=scheduler, warmup_steps=3), 12)
    reached = [stepped.get_last_lr()[0]]
    for _ in range(12):
        stepped_optimizer.step()
        stepped.step()
        reached.append(stepped.get_last_lr()[0])
    assert len(set(reached)) > 2  # warmup then the schedule: the lr moves
    optimizer, schedule = build_optimizer(torch.nn.Linear(2, 1), optim(scheduler=scheduler, warmup_steps=3), 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for position in (7, 0, 12, 3, 5):
            assert schedule_at(schedule, position) == reached[position]
            assert optimizer.param_groups[0]["lr"] == reached[position] and schedule.last_epoch == position
