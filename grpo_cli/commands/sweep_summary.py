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

FIGURES = ("steps", "wall_s", "reward_first10", "reward_last10")


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory that has Hydra's overrides record; failed jobs show no figures."""
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
        table = Table(title=f"sweep: {len(rows)} jobs ({sweep_dir}/sweep_summary.csv)")
        for column in columns:
            table.add_column(column, justify="left" if column in ("job", "overrides") else "right")
        for row in rows:
            values = (row.get(column) for column in columns)
            table.add_row(*(f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v)) for v in values))
        Console(stderr=True).print(table)
