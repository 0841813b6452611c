"""A resume that changes train.steps (issue 21 item 10): refused where a schedule runs on
step / train.steps (a non-constant lr schedule or curriculum), allowed where none does."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_cli.config.schema import CurriculumPhase, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.training import GRPOTrainer
from tests.conftest import reproducible


def config(steps: int, scheduler: str = "constant", curriculum: str = "constant") -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 4, 4
    cfg.train.save_every = 1
    cfg.data.num_examples = 100
    cfg.optim.scheduler, cfg.optim.warmup_steps = scheduler, 0
    cfg.curriculum.name = curriculum
    if curriculum == "phased":  # the default rewards, exact answers weighted up in the second half
        cfg.curriculum.phases = [
            CurriculumPhase(until=0.5, weights={"exact_match": 1.0}),
            CurriculumPhase(until=1.0, weights={"exact_match": 3.0}),
        ]
    return cfg


def train(cfg: TrainConfig, run_dir: Path) -> GRPOTrainer:
    trainer = GRPOTrainer(cfg, run_dir)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    return trainer


@pytest.mark.parametrize(
    ("scheduler", "curriculum", "named"),
    [("cosine", "constant", "optim.scheduler=cosine"), ("constant", "phased", "curriculum.name=phased")],
)
def test_changing_train_steps_under_a_schedule_needs_resume_allow_changes(
    tmp_path: Path, scheduler: str, curriculum: str, named: str
) -> None:
    train(config(1, scheduler, curriculum), tmp_path)  # checkpoints/step_000001, written with train.steps=1
    with pytest.raises(GrpoError) as info:
        GRPOTrainer(config(2, scheduler, curriculum), tmp_path).setup()
    message = str(info.value)
    assert "train.steps: 1 -> 2" in message and named in message and "train.resume_allow_changes=true" in message
    allowed = config(2, scheduler, curriculum)
    allowed.train.resume_allow_changes = True  # the schedules then run over the new length
    assert [row["step"] for row in train(allowed, tmp_path).history] == [2]


def test_a_run_with_no_schedule_on_train_steps_may_go_on_longer(tmp_path: Path) -> None:
    train(config(1), tmp_path)
    assert [row["step"] for row in train(config(2), tmp_path).history] == [2]


def test_a_multi_turn_run_resumes_as_if_never_stopped(tmp_path: Path) -> None:
    """With an environment, trajectories come from the saved sampling stream and fresh environment
    objects: 2 steps, then 2 more from the checkpoint, give what 4 straight steps give."""

    def multi_turn(steps: int) -> TrainConfig:
        cfg = config(steps)
        cfg.env.name, cfg.env.target = "custom", "tests.rollout.environments:EchoEnv"
        cfg.rollout.max_new_tokens = 16  # room for the tiny model to end a turn now and then
        return cfg

    straight = train(multi_turn(4), tmp_path / "straight").history
    train(multi_turn(2), tmp_path / "resumed")
    resumed = train(multi_turn(4), tmp_path / "resumed").history
    assert [row["step"] for row in resumed] == [3, 4]
    assert reproducible(resumed) == reproducible(straight[2:])
    assert max(row["env/turns_mean"] for row in straight) > 1.0  # trajectories with several turns were resumed
