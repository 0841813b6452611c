"""Output that is not a terminal (a file, a pipe, CI): every log record one unwrapped line, and the
sweep table with every override whole."""

from __future__ import annotations

import json
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from omegaconf import OmegaConf

from grpo_cli.commands.sweep_summary import SweepSummary


def test_log_lines_are_never_wrapped_when_stderr_is_a_pipe(smoke_run: tuple[CompletedProcess, Path]) -> None:
    result, run_dir = smoke_run  # `grpo train debug=smoke`, stderr a pipe, a run directory over 80 columns
    assert len(str(run_dir)) > 80
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "run directory:" in line]
    assert len(lines) == 1 and lines[0].endswith(f"[grpo][INFO] run directory: {run_dir}"), result.stderr[-2000:]
    assert lines[0] in (run_dir / "train.log").read_text().splitlines()  # the log file's line, as it is
    records = [line for line in result.stderr.splitlines() if "][grpo][" in line]
    assert len(records) > 3 and not any(line.endswith(" ") for line in records)  # nothing padded to a width


def test_the_sweep_table_shows_every_override_whole_in_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "multirun"
    overrides = [
        ["optim.lr=0.0005", "algo.beta=0.04", "rollout.num_generations=16", "reward=arithmetic"],
        ["optim.lr=0.002", "algo.beta=0.0", "rollout.num_generations=16", "reward=arithmetic"],
    ]
    for job, job_overrides in enumerate(overrides):
        (sweep / str(job) / ".hydra").mkdir(parents=True)
        (sweep / str(job) / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in job_overrides))
        summary = {"steps": 300, "wall_s": 61.5, "reward_first10": 0.1, "reward_last10": 0.5, "last10/exact": 0.4}
        (sweep / str(job) / "summary.json").write_text(json.dumps(summary))
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    table = capsys.readouterr().err  # captured: not a terminal
    for job_overrides in overrides:
        assert " ".join(job_overrides) in table
    assert "…" not in table
    assert "sweep_summary.csv" in table
