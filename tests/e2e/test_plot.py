"""`grpo plot` takes a run's metrics.jsonl for its run directory: the file the curves are drawn
from is what a user finds first, and it was refused as neither a run nor a multirun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_cli.commands.plot import DEFAULT_OVERLAY, main

ROWS = [{"step": s, "reward/mean": 0.1 * s, "loss": 1.0 / s} for s in range(1, 4)]


def write_metrics(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return metrics


def test_a_metrics_file_draws_its_runs_pictures_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = write_metrics(tmp_path / "run")
    main([str(metrics)])
    run = tmp_path / "run"
    assert capsys.readouterr().out.split() == [str(run / "curves.png"), str(run / "nan_heatmap.png")]


def test_two_metrics_files_overlay_their_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one, two = write_metrics(tmp_path / "one"), write_metrics(tmp_path / "two")
    main([str(one), str(two)])
    assert capsys.readouterr().out.split() == [str(DEFAULT_OVERLAY)]
    assert (tmp_path / DEFAULT_OVERLAY).is_file()


def test_another_file_is_still_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_metrics(tmp_path / "run")
    summary = tmp_path / "run" / "summary.json"
    summary.write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main([str(summary)])
    assert exit_info.value.code == 2 and f"{summary}: neither a run directory" in capsys.readouterr().err
