"""After a multirun: one table and one CSV with every job's overrides and final figures."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from grpo_cli.monitor.terminal import stderr_console

FIGURES = ("steps", "wall_s", "reward_first10", "reward_last10")
DEFAULT_OBJECTIVE = "reward_last10"  # TrainConfig.sweep.objective's default
MEASURE_WIDTH = 100_000  # room to measure the table's natural width in


def objective_key(job_dir: Path) -> str:
    """The summary.json figure the job returned to the sweeper: its `sweep.objective`, as Hydra saved
    the job's config (the key may be swept too, or set in a recipe)."""
    config_file = job_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.exists() else None
    sweep = config.get("sweep") if isinstance(config, dict) else None
    key = sweep.get("objective") if isinstance(sweep, dict) else None
    return key if isinstance(key, str) else DEFAULT_OBJECTIVE


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory that has Hydra's overrides record; failed jobs show no figures.

    Any sweeper that launches through a Hydra launcher numbers its jobs' directories the same way
    (optuna's trials too: 0, 1, ... across its batches), so one glob finds them all."""
    rows = []
    for overrides_file in sorted(sweep_dir.glob("*/.hydra/overrides.yaml"), key=lambda p: p.parts[-3].zfill(8)):
        job_dir = overrides_file.parent.parent
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        summary_file = job_dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
        per_function = {k: v for k, v in summary.items() if k.startswith("last10/")}  # e.g. last10/exact_match
        rows.append(
            {
                "job": job_dir.name,
                "overrides": " ".join(overrides),
                "objective": summary.get(objective_key(job_dir)),  # what an optuna sweep maximised
                **{k: summary.get(k) for k in FIGURES},
                **per_function,
            }
        )
    return rows


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect_jobs(sweep_dir)
        if not rows:
            return
        columns = list(dict.fromkeys(k for row in rows for k in row))  # jobs may differ (a failed one has none)
        with (sweep_dir / "sweep_summary.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        objectives = ", ".join(sorted({objective_key(sweep_dir / str(row["job"])) for row in rows}))
        table = Table(title=f"sweep: {len(rows)} jobs, objective {objectives} ({sweep_dir}/sweep_summary.csv)")
        for column in columns:  # overrides fold on a narrow terminal, never cut to `optim…`
            table.add_column(column, justify="left" if column in ("job", "overrides") else "right", overflow="fold")
        for row in rows:
            values = (row.get(column) for column in columns)
            table.add_row(*(f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v)) for v in values))
        console = stderr_console()
        if not console.is_terminal:  # a file or a pipe has no width to fit: the table's own, nothing cut or wrapped
            width = max(Console(width=MEASURE_WIDTH).measure(table).maximum, len(str(table.title)))
            console = stderr_console(width=width)
        console.print(table)
