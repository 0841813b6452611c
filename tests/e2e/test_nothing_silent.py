"""What used to happen without a word: a scored file overwritten, a failed score's `.partial` file
left behind, a killed run's steps replaced by a rerun, a Ctrl-C missing from train.log, a multirun's
overlay dropped in whatever directory the shell was in."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_cli.commands.overrides import check_overrides
from grpo_cli.commands.plot import DEFAULT_OVERLAY, plot
from grpo_cli.commands.score import run_score
from grpo_cli.config import TrainConfig
from grpo_cli.config.schema import ScoreConfig
from grpo_cli.config.smoke import apply_smoke
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.monitor.files import read_metrics_rows
from grpo_cli.training import GRPOTrainer
from tests.conftest import run_grpo
from tests.e2e.test_score import write_rollouts


def test_score_refuses_an_existing_output_as_rollout_does(tmp_path: Path) -> None:
    rollouts, scored = tmp_path / "rollouts.jsonl", tmp_path / "scored.jsonl"
    write_rollouts(rollouts, [("1+1=", "2", ["2", "3"])])
    scored.write_text("an earlier, expensive result\n")
    with pytest.raises(GrpoError, match=rf"output={scored} already exists: grpo score does not overwrite"):
        run_score(ScoreConfig(input=str(rollouts), output=str(scored)))
    assert scored.read_text() == "an earlier, expensive result\n"


def test_a_rerun_after_a_kill_without_checkpoints_says_it_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    metrics = MetricsFile(run_dir / "metrics.jsonl")  # what a run killed (-9) after 3 steps with save_every=0 left
    for step in (1, 2, 3):
        metrics.on_step(StepResult(step, {"step": step, "reward/mean": 0.1}))
    metrics.close()
    cfg = TrainConfig()
    apply_smoke(cfg)  # as `grpo train debug=smoke` runs it
    trainer = GRPOTrainer(cfg, run_dir)
    with caplog.at_level(logging.WARNING, logger="grpo"):
        trainer.setup()
    trainer.cleanup()
    assert trainer.resumed_from is None
    said = [r.getMessage() for r in caplog.records if "starts over" in r.getMessage()]
    assert said == [
        f"{run_dir / 'metrics.jsonl'} holds 3 step(s) of an earlier run in this directory (up to step 3) but no "
        "checkpoint is resumed (none was saved, train.save_every=0 saving only at the end; or train.resume=never): "
        "this run starts over from step 0 and replaces them"
    ]
    assert read_metrics_rows(run_dir) == []


def test_a_multirun_overlay_goes_into_the_multirun_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = tmp_path / "multirun"
    for job, lr in enumerate(("0.001", "0.002")):
        (sweep / str(job) / ".hydra").mkdir(parents=True)
        (sweep / str(job) / ".hydra" / "overrides.yaml").write_text(f"- optim.lr={lr}\n")
        rows = [{"step": s, "reward/mean": s * float(lr), "loss": 1.0 / s} for s in range(1, 6)]
        (sweep / str(job) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    elsewhere = tmp_path / "shell"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert plot([sweep], None) == [sweep / DEFAULT_OVERLAY]
    assert (sweep / DEFAULT_OVERLAY).is_file() and not any(elsewhere.iterdir())
    assert plot([sweep / "0", sweep / "1"], None) == [DEFAULT_OVERLAY]  # several directories: here, as before
    assert (elsewhere / DEFAULT_OVERLAY).is_file()


def test_a_failed_score_leaves_no_partial_file(tmp_path: Path) -> None:
    rollouts, scored = tmp_path / "rollouts.jsonl", tmp_path / "scored.jsonl"
    write_rollouts(rollouts, [("1+1=", "2", ["2", "3"])])
    with rollouts.open("a") as handle:  # the first batch is scored and written before the bad line is read
        handle.write('{"prompt": "2+2=", "answer": "4"}\n')
    with pytest.raises(GrpoError, match=rf"{rollouts}:2: expected an object with `prompt` and a `completions` list"):
        run_score(ScoreConfig(input=str(rollouts), output=str(scored), batch_size=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.jsonl"]


def test_ctrl_c_is_in_train_log(tmp_path: Path) -> None:
    """train.log is what is left to read of a run in the background or on a cluster: it must say
    how the run ended and how to resume it, as the console does."""
    (tmp_path / "ctrl_c.py").write_text(
        textwrap.dedent(
            """
            import os, signal

            calls = 0

            def length_then_interrupt(prompts, completions, **_):
                global calls
                calls += 1
                if calls == 3:  # while step 3 is scored
                    os.kill(os.getpid(), signal.SIGINT)
                return [float(len(c)) for c in completions]
            """
        )
    )
    run_dir = tmp_path / "run"
    result = run_grpo(
        "train",
        "train.steps=5",
        "train.prompts_per_step=2",
        "rollout.num_generations=2",
        "reward.timeout_s=0",  # in the main thread, where the signal lands
        "reward.functions=[{name: length, target: 'ctrl_c:length_then_interrupt'}]",
        "monitor.console=quiet",
        "monitor.plots=false",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 130, result.stderr[-3000:]
    said = [line for line in (run_dir / "train.log").read_text().splitlines() if "interrupted" in line]
    assert len(said) == 1 and said[0].split("] ", 1)[0].endswith("[grpo][WARNING"), said
    assert said[0].endswith(
        f"interrupted after step 2; checkpoint {run_dir / 'checkpoints' / 'step_000002'}. Resume with: grpo train "
        "train.steps=5 train.prompts_per_step=2 rollout.num_generations=2 reward.timeout_s=0 'reward.functions=[{name: "
        f"length, target: '\"'\"'ctrl_c:length_then_interrupt'\"'\"'}}]' monitor.console=quiet monitor.plots=false "
        f"hydra.run.dir={run_dir}"
    ), said


def test_a_key_given_twice_in_a_sweep_is_refused_instead_of_collapsing_the_jobs() -> None:
    # Hydra kept one of the two: `-m train.seed=0,1 train.seed=2` ran 1 job, not the 2 or 3 meant
    says = r"^-m: train\.seed is given twice \(train\.seed=0,1 and train\.seed=2\): a sweep takes one value list"
    with pytest.raises(GrpoError, match=says):
        check_overrides(["-m", "train.seed=0,1", "train.seed=2"], TrainConfig)
    with pytest.raises(GrpoError, match=r"^-m: reward is given twice"):  # a group choice too
        check_overrides(["-m", "reward=arithmetic,length", "reward=length"], TrainConfig)
    check_overrides(["-m", "train.seed=0,1", "optim.lr=1e-3,2e-3"], TrainConfig)  # 4 jobs, as written
    check_overrides(["train.seed=1", "train.seed=2"], TrainConfig)  # one run: the last wins, as Hydra documents


def test_accelerate_launch_cpu_with_two_processes_is_refused_not_run_as_one(tmp_path: Path) -> None:
    """accelerate's --cpu launcher starts one process whatever --num_processes says (more needs MPI)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [*launch, "-m", "grpo_cli", "train", "--cfg", "job"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout[-2000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("error: ")]  # accelerate adds its own
    assert said[0].startswith(
        "error: accelerate launch asked for several processes (--num_processes) but started this one only"
    ), result.stderr[-2000:]
    one = subprocess.run([*launch[:-1], "1", "-m", "grpo_cli", "train", "--cfg", "job"], env=env, capture_output=True)
    assert one.returncode == 0, one.stderr[-2000:]  # one process asked for, one run
