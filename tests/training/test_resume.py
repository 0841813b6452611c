"""A resume that changes train.steps (issue 21 item 10): refused where a schedule runs on
step / train.steps (a non-constant lr schedule or curriculum), allowed where none does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_cli.checkpoint import latest_checkpoint
from grpo_cli.config.schema import CurriculumPhase, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import MetricsFile
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


def test_a_fresh_start_in_a_used_directory_leaves_nothing_of_the_old_run_to_resume(tmp_path: Path) -> None:
    """train.resume=never over a run that got further (step 2): the fresh run's checkpoints and
    metric lines are its own, and the next plain command resumes the fresh run, not the old one.
    The old run is set aside whole, never deleted."""
    old = MetricsFile(tmp_path / "metrics.jsonl")
    trainer = GRPOTrainer(config(2), tmp_path, [old])
    trainer.setup()
    trainer.train()
    old.close()
    trainer.cleanup()
    old_lines = (tmp_path / "metrics.jsonl").read_text()
    fresh = config(1)
    fresh.train.seed, fresh.train.resume = 1, "never"
    (tmp_path / "tb").mkdir()  # a tracker's events of the old run
    new = MetricsFile(tmp_path / "metrics.jsonl")
    trainer = GRPOTrainer(fresh, tmp_path, [new])
    trainer.setup()
    trainer.train()
    new.close()
    trainer.cleanup()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    fresh_lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # the fresh run's only
    assert [json.loads(line)["step"] for line in fresh_lines] == [1] and fresh_lines[0] not in old_lines
    assert not (tmp_path / "tb").exists()
    aside = tmp_path / "replaced_1"
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert (aside / "metrics.jsonl").read_text() == old_lines and (aside / "tb").is_dir()
    go_on = config(2)
    go_on.train.seed = 1
    assert train(go_on, tmp_path).resumed_from == tmp_path / "checkpoints" / "step_000001"


def test_branching_from_an_older_checkpoint_of_the_same_directory_is_refused(tmp_path: Path) -> None:
    train(config(2), tmp_path)
    branch = config(2)
    branch.train.resume = str(tmp_path / "checkpoints" / "step_000001")
    with pytest.raises(GrpoError, match=r"holds a later checkpoint \(step_000002\).*another hydra.run.dir"):
        GRPOTrainer(branch, tmp_path).setup()


def truncate_training_state(checkpoint: Path) -> None:
    path = checkpoint / "training_state.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy cut short, a disk that filled


def garble_trainer_state(checkpoint: Path) -> None:
    (checkpoint / "trainer_state.json").write_text('{"step": 2, "conf')


def truncate_weights(checkpoint: Path) -> None:
    path = checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size - 100])


@pytest.mark.parametrize("corrupt", [truncate_training_state, garble_trainer_state, truncate_weights])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before_saying_so(
    tmp_path: Path, corrupt, caplog: pytest.LogCaptureFixture
) -> None:
    train(config(2), tmp_path)
    corrupt(tmp_path / "checkpoints" / "step_000002")
    with caplog.at_level("WARNING", logger="grpo"):
        resumed = train(config(3), tmp_path)
    assert resumed.resumed_from == tmp_path / "checkpoints" / "step_000001"
    assert [row["step"] for row in resumed.history] == [2, 3]
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and "step_000002" in said[0] and "resuming from step_000001" in said[0], said


def test_a_corrupt_checkpoint_named_by_train_resume_is_one_line_naming_the_file(tmp_path: Path) -> None:
    train(config(1), tmp_path / "old")
    truncate_training_state(tmp_path / "old" / "checkpoints" / "step_000001")
    named = config(2)
    named.train.resume = str(tmp_path / "old" / "checkpoints" / "step_000001")
    with pytest.raises(GrpoError) as refused:
        GRPOTrainer(named, tmp_path / "new").setup()
    assert "step_000001/training_state.pt cannot be read" in str(refused.value)
    assert "\n" not in str(refused.value)
