"""The rich console: a progress bar with the live reward, and a table at the end."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from grpo_cli.monitor.observer import StepResult
from grpo_cli.stats import column_mean


class TrainingConsole:
    """A context manager and an observer: the bar lives from the first step to the end."""

    def __init__(self, total_steps: int, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.total_steps = total_steps
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("kl {task.fields[kl]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
        )
        self.task = None

    def __enter__(self) -> TrainingConsole:
        self.progress.start()
        self.task = self.progress.add_task("train", total=self.total_steps, reward="-", kl="-")
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_step(self, result: StepResult) -> None:
        for alert in result.alerts:  # printed above the bar, even with progress disabled
            self.console.print(f"[bold yellow]alert (step {result.step}):[/] {alert}", highlight=False)
        metrics = result.metrics
        kl = metrics.get("kl")
        self.progress.update(
            self.task,
            completed=result.step,
            reward=f"{metrics['reward/mean']:.3f}",
            kl="-" if kl is None else f"{kl:.4f}",
        )


def summary_table(summary: dict[str, Any], history: list[dict[str, Any]]) -> Table:
    table = Table(title="grpo train: summary", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("first 10 steps", justify="right")
    table.add_column("last 10 steps", justify="right")
    first, last = history[:10], history[-10:]
    keys = [k for k in history[0] if k.startswith("reward/") and k.endswith("mean")] if history else []
    keys += ["completion_len/mean", "frac_zero_std_groups", "kl", "clip_frac"]
    for key in keys:

        def mean(rows: list[dict[str, Any]], key: str = key) -> str:
            value = column_mean(rows, key)
            return "-" if math.isnan(value) else f"{value:.4f}"

        table.add_row(key, mean(first), mean(last))
    table.caption = (
        f"{summary['steps']} steps in {summary['wall_s']:.1f}s; checkpoint: {summary.get('final_checkpoint')}"
    )
    return table
