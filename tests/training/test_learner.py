"""The learning-rate schedule that build_learner sizes, through the real GRPOTrainer and the tiny
model: a function of the training step, as the curriculum is. Dynamic sampling's short batches and
updates it skips do not shift the later steps' lr (issue 33 item 5: a linear schedule ended at half
of optim.lr), and a resume lands on the same series."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_cli.config.schema import TrainConfig
from grpo_cli.data import PromptSampler
from tests.conftest import read_metrics
from tests.training import test_dynamic_sampling as sampling
from tests.training.test_trainer import InterruptAt

LR = 1e-3


def config(dynamic_sampling: bool) -> TrainConfig:
    """3 steps of 2 planned optimizer steps each, on a linear schedule without warmup: step s trains
    from lr·(1 − 2s/6). With dynamic sampling the steps hold 1, 0 and 3 groups with a signal: 1, 0
    and 2 optimizer steps (tests/training/test_dynamic_sampling.py, the short-batch case)."""
    cfg = sampling.config("signal_for_chosen_prompts", steps=3, max_draws=2, mini_batches=2)
    cfg.algo.dynamic_sampling.enabled = dynamic_sampling
    cfg.optim.lr, cfg.optim.scheduler, cfg.optim.warmup_steps = LR, "linear", 0
    return cfg


@pytest.fixture
def signal_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompts with a signal: one in step 1's two draws, none in step 2's, three in step 3's."""
    sampler = PromptSampler(sampling.train_examples(config(True), tmp_path), config(True).train.seed)
    draws = [[ex["prompt"] for ex in sampler.next_batch(8)] for _ in range(3)]
    monkeypatch.setattr(sampling, "SIGNAL_PROMPTS", {draws[0][5], *draws[2][1:4]})  # the reward reads it here


@pytest.mark.usefixtures("signal_prompts")
def test_the_lr_is_a_function_of_the_step_with_dynamic_sampling_on_and_off(tmp_path: Path) -> None:
    refilled, _ = sampling.run(config(True), tmp_path / "dynamic")
    plain, _ = sampling.run(config(False), tmp_path / "plain")
    assert [row["optimizer_steps"] for row in refilled.history] == [1, 0, 2]  # the premise: short steps
    assert [row["optimizer_steps"] for row in plain.history] == [2, 2, 2]
    expected = [LR * (1 - 2 * s / 6) for s in range(3)]
    assert [row["lr"] for row in refilled.history] == pytest.approx(expected, rel=1e-9)
    assert [row["lr"] for row in plain.history] == pytest.approx(expected, rel=1e-9)


@pytest.mark.usefixtures("signal_prompts")
def test_a_resume_continues_the_same_schedule(tmp_path: Path) -> None:
    """Saved after step 1 (one of its two planned updates applied), resumed: steps 2 and 3 log the
    lr of the uninterrupted run."""
    straight, _ = sampling.run(config(True), tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        sampling.run(config(True), tmp_path / "resumed", InterruptAt(1))
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["step_000001"]
    sampling.run(config(True), tmp_path / "resumed")  # train.resume=auto
    resumed = read_metrics(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == [1, 2, 3]
    assert [row["lr"] for row in resumed] == [row["lr"] for row in straight.history]
