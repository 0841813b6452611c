"""metrics.jsonl after a crash: a resume keeps every finished step and drops half a line; the completion
log of a short run."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_cli.config.schema import TrainConfig
from grpo_cli.monitor import CompletionLog
from grpo_cli.monitor.files import read_metrics_rows, truncate_metrics
from grpo_cli.training import GRPOTrainer
from tests.conftest import Recorder


def test_a_resume_drops_a_half_written_last_line_and_the_steps_it_runs_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": n, "loss": n / 10} for n in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # killed mid-write
    assert truncate_metrics(path, 2) == rows[:2]
    assert read_metrics_rows(tmp_path) == rows[:2]
    assert path.read_text().endswith("\n")  # the next step's line starts on its own line


def test_a_run_shorter_than_log_completions_every_keeps_its_first_steps_completions(tmp_path: Path) -> None:
    """A 2-step run at the default monitor.log_completions_every (10): step 1's completions are written,
    as the trainer hands them over, so a short trial run shows what the model sampled."""
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 2, 2, 4
    assert cfg.monitor.log_completions_every > cfg.train.steps
    recorder = Recorder()
    trainer = GRPOTrainer(cfg, tmp_path, [CompletionLog(tmp_path / "completions", 10), recorder])
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    assert sorted(p.name for p in (tmp_path / "completions").iterdir()) == ["step_000001.jsonl"]
    written = [json.loads(line) for line in (tmp_path / "completions" / "step_000001.jsonl").read_text().splitlines()]
    assert written == recorder.results[0].samples and written
