"""metrics.jsonl after a crash: a resume keeps every finished step and drops half a line."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_cli.monitor.files import read_metrics_rows, truncate_metrics


def test_a_resume_drops_a_half_written_last_line_and_the_steps_it_runs_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": n, "loss": n / 10} for n in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # killed mid-write
    assert truncate_metrics(path, 2) == rows[:2]
    assert read_metrics_rows(tmp_path) == rows[:2]
    assert path.read_text().endswith("\n")  # the next step's line starts on its own line
