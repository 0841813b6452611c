"""Stability guards with worked numbers, the pause exit code and its resume, and the stop after
repeated non-finite steps (the checkpoint holds the last good weights)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.config.schema import GuardConfig, TrainConfig
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.guards import EXIT_PAUSED, EXIT_STOPPED, StabilityGuard, TrainingHalted
from tests.conftest import Recorder, read_metrics, run_grpo

UNSTABLE = [1.0, 3.0]  # mean 2, std 1.414: CV 0.707 > 0.5
STABLE = [1.9, 2.1]  # CV 0.0707
SEED = GuardConfig(reward_cv_threshold=0.5)  # seed 001's rule: std above half the mean
NEAR_ZERO = [-0.0004, 0.0006]  # |mean| 0.0001 < min_abs_mean 0.001: CV undefined


def test_the_cv_streak_triggers_after_patience_once_per_episode() -> None:
    guard = StabilityGuard(replace(SEED, action="pause"))
    assert guard.reward_cv(UNSTABLE) == pytest.approx(2**0.5 / 2)
    assert guard.observe(UNSTABLE, 1, 0) == [] and guard.cv_streak == 1
    assert guard.observe(UNSTABLE, 1, 0) == [] and guard.cv_streak == 2
    (verdict,) = guard.observe(UNSTABLE, 1, 0)
    assert verdict.action == "pause" and "3 batches in a row" in verdict.reason
    # The episode goes on: no further verdict, in this run or in one resumed from its checkpoint.
    resumed = StabilityGuard(replace(SEED, action="pause"))
    resumed.load_state_dict(guard.state_dict())
    for g in (guard, resumed):
        assert [g.observe(UNSTABLE, 1, 0) for _ in range(40)] == [[]] * 40 and g.cv_streak == 43
    assert guard.observe(NEAR_ZERO, 1, 0) == []  # an undefined CV does not end it either
    assert guard.observe(STABLE, 1, 0) == [] and guard.cv_streak == 0  # a stable batch ends it
    assert [len(guard.observe(UNSTABLE, 1, 0)) for _ in range(4)] == [0, 0, 1, 0]  # a new episode: one verdict


def test_a_stable_batch_resets_and_a_mean_near_zero_neither_counts_nor_resets() -> None:
    guard = StabilityGuard(SEED)
    guard.observe(UNSTABLE, 1, 0)
    guard.observe(UNSTABLE, 1, 0)
    assert guard.reward_cv(NEAR_ZERO) is None
    assert guard.observe(NEAR_ZERO, 1, 0) == [] and guard.cv_streak == 2  # held, not reset
    assert guard.observe(STABLE, 1, 0) == [] and guard.cv_streak == 0
    nan = float("nan")
    assert guard.reward_cv([nan, nan]) is None  # nothing scorable: undefined too


def test_non_finite_steps_in_a_row_stop_and_one_good_step_resets() -> None:
    guard = StabilityGuard(GuardConfig(max_skipped_steps=2, action="warn"))
    assert guard.observe(STABLE, 0, 1) == []
    assert guard.observe(STABLE, 1, 1) == [] and guard.skipped_streak == 0  # one update went through
    assert guard.observe(STABLE, 0, 2) == []
    (verdict,) = guard.observe(STABLE, 0, 1)
    assert verdict.action == "stop"  # whatever guard.action says: there is nothing left to train
    state = guard.state_dict()
    resumed = StabilityGuard(GuardConfig(max_skipped_steps=2))
    resumed.load_state_dict(state)
    assert resumed.skipped_streak == guard.skipped_streak


def test_the_default_run_trains_on_with_guard_action_pause(tmp_path: Path) -> None:
    """The default task's healthy batches have a raw reward CV of 0.2-1.1: under seed 001's 0.5
    the default run warned 28 times in 300 steps, and with guard.action=pause it stopped at step 10."""
    cfg = TrainConfig()
    cfg.train.steps, cfg.guard.action = 12, "pause"
    recorder = Recorder()
    trainer = GRPOTrainer(cfg, tmp_path, [recorder])
    trainer.setup()
    trainer.train()  # no TrainingHalted
    trainer.cleanup()
    assert [r.step for r in recorder.results] == list(range(1, 13))
    assert [a for r in recorder.results for a in r.alerts if a.startswith("guard")] == []
    assert max(r.metrics["guard/reward_cv"] for r in recorder.results) > 0.5  # the seed's threshold would count them


class WeightsAfterEachStep:
    def __init__(self, trainer_ref: list[GRPOTrainer]) -> None:
        self.trainer_ref, self.weights = trainer_ref, {}

    def on_step(self, result: StepResult) -> None:
        model = self.trainer_ref[0].model
        self.weights[result.step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_repeated_non_finite_steps_stop_with_the_last_good_weights(tmp_path: Path) -> None:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 8, 4, 4
    cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.max_grad_norm = 1e30, 0, 0.0  # one step blows the model up
    ref: list[GRPOTrainer] = []
    watcher = WeightsAfterEachStep(ref)
    trainer = GRPOTrainer(cfg, tmp_path, [watcher])
    ref.append(trainer)
    trainer.setup()
    with pytest.raises(TrainingHalted) as info:
        trainer.train()
    assert info.value.exit_code == EXIT_STOPPED and info.value.step == 4
    assert [(r["optimizer_steps"], r["skipped_updates"]) for r in trainer.history] == [(1, 0), (0, 1), (0, 1), (0, 1)]
    saved = load_file(Path(info.value.checkpoint) / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(tensor, watcher.weights[1][name])  # step 1 was the last applied update
    trainer.cleanup()


def test_pause_exits_75_with_the_resume_command_and_the_resume_continues(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train.steps=4", "train.prompts_per_step=4", "rollout.num_generations=4", "monitor.console=quiet"]
    args.append("monitor.plots=false")  # not what this tests
    guard = ["guard.action=pause", "guard.reward_cv_threshold=0.01", "guard.patience=2"]
    paused = run_grpo("train", *args, *guard, f"hydra.run.dir={run_dir}")
    assert paused.returncode == EXIT_PAUSED, paused.stderr[-3000:]
    assert "paused by a stability guard after step 2" in paused.stderr
    assert f"grpo train {' '.join(args + guard)} hydra.run.dir={run_dir}" in paused.stderr
    assert (run_dir / "checkpoints" / "step_000002").is_dir() and len(read_metrics(run_dir)) == 2
    # The resume (here in-process: the CLI part is above) may change guard settings: not the maths.
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 4, 4, 4
    cfg.guard.reward_cv_threshold, cfg.guard.patience = 0.01, 2
    trainer = GRPOTrainer(cfg, run_dir, [MetricsFile(run_dir / "metrics.jsonl")])
    trainer.setup()
    assert trainer.step_index == 2
    trainer.train()
    trainer.observers[0].close()
    trainer.cleanup()
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3, 4]
