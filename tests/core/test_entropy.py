"""Adaptive entropy control (algo.adaptive_entropy, Skywork-OR1): the coefficient's rule on worked
numbers, its moves across the optimizer steps of real updates on the tiny model (each step applying
the coefficient the previous steps left), and its state through a save and a load."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from grpo_cli.config.schema import AdaptiveEntropyConfig, AlgoConfig
from grpo_cli.core.entropy import AdaptiveEntropy, entropy_bonus_on
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, plan_mini_batches, policy_update
from tests.core.conftest import NEW, advantages_for, flat
from tests.core.test_update import run_update


def controller(**overrides) -> AdaptiveEntropy:
    cfg = AdaptiveEntropyConfig(enabled=True, **{"coef_delta": 0.01, "target": 1.0, **overrides})
    return AdaptiveEntropy(cfg, 0.02)


def test_the_coefficient_rises_below_the_target_falls_above_and_stays_in_its_bounds() -> None:
    control = controller(coef_min=0.005, coef_max=0.04)
    seen = []
    for entropy in (0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0, 1.0):
        control.observe(entropy)
        seen.append((round(control.coef, 6), round(control.coefficient(), 6)))
    assert seen == [
        (0.03, 0.03),  # at or below the target: up, and applied from the next step
        (0.04, 0.04),
        (0.04, 0.04),  # the ceiling
        (0.03, 0.0),  # above: down, and off
        (0.02, 0.0),
        (0.01, 0.0),
        (0.005, 0.0),  # the floor
        (0.015, 0.015),  # exactly at the target counts as below (TRL's <=)
    ]


def test_nothing_measured_leaves_the_state_alone_and_disabled_is_the_static_coefficient() -> None:
    control = controller()
    assert control.coefficient() == 0.0  # before any measurement the bonus is off
    control.observe(math.nan)  # a step with no kept token
    assert control.state_dict() == {"coef": 0.02, "last_entropy": None}
    static = AdaptiveEntropy(AdaptiveEntropyConfig(), 0.02)
    static.observe(0.1)
    assert static.coefficient() == 0.02 and static.state_dict() == {"coef": 0.02, "last_entropy": None}
    assert entropy_bonus_on(AlgoConfig(adaptive_entropy=AdaptiveEntropyConfig(enabled=True)))
    assert not entropy_bonus_on(AlgoConfig())


def test_the_state_survives_a_save_and_a_load() -> None:
    """torch.save is how checkpoints write TrainState; a loaded controller continues as the live one."""
    live = controller()
    for entropy in (0.5, 0.7):
        live.observe(entropy)
    buffer = io.BytesIO()
    torch.save({"entropy": live.state_dict()}, buffer)
    buffer.seek(0)
    resumed = controller()
    resumed.load_state_dict(torch.load(buffer)["entropy"])
    assert resumed.state_dict() == live.state_dict() == {"coef": pytest.approx(0.04), "last_entropy": 0.7}
    for entropy in (2.0, 0.3):
        live.observe(entropy)
        resumed.observe(entropy)
        assert resumed.coefficient() == live.coefficient()


def test_each_optimizer_step_applies_the_coefficient_the_previous_ones_left(base_model, rollout) -> None:
    """Zero advantages, beta 0, SGD at lr 1, two mini-batches per pass and two passes: four
    optimizer steps whose loss is the bonus alone. The controller starts applied at 0.05 (last
    entropy under the target) and rises by 0.02 each step: steps 1-4 apply 0.05, 0.07, 0.09, 0.11.
    The same update with a static entropy_coef at each step's value, step by step, moves the weights
    to the same place; the entropy the controller last measured is the fourth step's: its rows'
    loss tokens under the weights the third step left."""
    zero = torch.zeros(rollout.completion_ids.size(0))
    cfg = AdaptiveEntropyConfig(enabled=True, coef_delta=0.02, target=100.0)
    algo = AlgoConfig(entropy_coef=0.01, mini_batches=2, num_iterations=2, adaptive_entropy=cfg)
    control = AdaptiveEntropy(cfg, algo.entropy_coef)
    control.load_state_dict({"coef": 0.05, "last_entropy": 3.0})
    model = copy.deepcopy(base_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.manual_seed(1)  # the mini-batch plan draws from the global RNG
    stats = policy_update(
        Learner(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)),
        UpdateBatch(rollout, zero, rollout.completion_mask.float()),
        algo,
        UpdateSettings(1.0, NEW, 1, 0.0, "padded"),
        entropy_control=control,
    )
    assert stats.optimizer_steps == 4
    assert control.coef == pytest.approx(0.13) and control.coefficient() == pytest.approx(0.13)

    # the same four steps by hand: each a one-mini-batch update on that step's rows at a static coefficient
    torch.manual_seed(1)  # the plans policy_update drew, in its order: one per pass
    g = rollout.group_size
    steps = [rows for _ in range(2) for rows in plan_mini_batches(len(zero) // g, g, 2)]
    by_hand = copy.deepcopy(base_model)
    for coef, rows in zip((0.05, 0.07, 0.09, 0.11), steps):
        mask = torch.zeros_like(rollout.completion_mask, dtype=torch.float32)
        mask[rows] = rollout.completion_mask[rows].float()  # only this step's rows in the loss
        with torch.no_grad():
            _, entropies = rows_logprobs(by_hand, rollout, rows, 1.0, "padded", with_entropy=True)
        measured = ((entropies * mask[rows]).sum() / mask[rows].sum()).item()
        run_update(by_hand, rollout, zero, mask, AlgoConfig(entropy_coef=coef))
    torch.testing.assert_close(flat(model), flat(by_hand), rtol=0, atol=1e-6)
    assert (flat(model) - flat(base_model)).abs().max() > 1e-3  # the bonus moved the weights
    assert control.last_entropy == pytest.approx(measured, rel=1e-5)


def test_an_enabled_controller_must_be_passed_in(base_model, rollout) -> None:
    """A controller made inside policy_update would forget its state at every call."""
    algo = AlgoConfig(adaptive_entropy=AdaptiveEntropyConfig(enabled=True))
    with pytest.raises(ValueError, match="pass the run's AdaptiveEntropy"):
        run_update(copy.deepcopy(base_model), rollout, advantages_for(rollout), algo=algo)
