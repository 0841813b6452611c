"""What `grpo train` prints while it runs (`monitor.console`) and the table at the end.

`rich`: a live panel (progress bar, the last step's key figures, the latest alerts) for a
terminal. `plain`: one line every `print_every` steps, no cursor movement or colour codes, for CI
logs and files. `quiet`: alerts only. `auto` picks rich on a terminal and plain otherwise.
Alerts (a reward function masked or failing, a guard, a repetition jump, reward hacking) and events
(a curriculum phase begins) are printed in every mode, and written to the run's log file (train.log).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from grpo_cli.monitor.heartbeat import Heartbeat
from grpo_cli.monitor.observer import StepResult, completions_due, reward_function_names
from grpo_cli.monitor.repeats import AlertRepeats
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.stats import column_mean

ALERTS_SHOWN = 5  # the live panel keeps the latest alerts in view; all are also printed above it
STAGE_COUNTS = {  # how a stage's (done, total) read
    "sampling": "{done}/{total} tokens",
    "evaluating": "{done}/{total} tokens",  # train.eval_every's greedy answers
    "training": "micro-batch {done}/{total}",
}
log = logging.getLogger("grpo")


def to_log_files(level: int, message: str) -> None:
    """A record for the run's log file (train.log) alone: the console already shows the message in
    its own layout, and the file must tell the run's story (alerts, phase changes, how it ended)."""
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def console_mode(setting: str, console: Console) -> str:
    """`auto` -> rich on a terminal, plain otherwise: a progress bar's escape codes garble CI logs."""
    if setting == "auto":
        return "rich" if console.is_terminal else "plain"
    return setting


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10**-digits or value == 0 else f"{value:.1e}"
    return str(value)


def key_figures(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of one step, in reading order: what the panel and the plain line show."""
    figures = [("reward", _fmt(metrics.get("reward/mean")))]
    figures += [(name, _fmt(metrics.get(f"reward/{name}/mean"))) for name in reward_function_names(metrics)]
    figures += [
        ("kl", _fmt(metrics.get("kl"), 4)),
        ("entropy", _fmt(metrics.get("entropy"), 2)),
        ("clip", _fmt(metrics.get("clip_frac"))),
        ("eps", f"{_fmt(metrics.get('clip/epsilon_low'))}/{_fmt(metrics.get('clip/epsilon_high'))}"),
        ("len", _fmt(metrics.get("completion_len/mean"), 1)),
        ("distinct2", _fmt(metrics.get("diversity/distinct2_group"), 2)),
        ("rep", _fmt(metrics.get("repetition/rate"), 2)),
        ("tok/s", _fmt(metrics.get("throughput/tokens_per_s"), 0)),
        ("mem MiB", _fmt(metrics.get("memory/peak_mib"), 0)),
    ]
    if "eval/reward/mean" in metrics:
        figures.append(("eval", _fmt(metrics["eval/reward/mean"])))
    return figures


def stage_text(step: int, stage: str, done: int = 0, total: int = 0) -> str:
    """What the step under way is doing (a `StageReport`'s figures), as the heartbeat and the panel say it.

    >>> stage_text(1, "sampling", 120, 512), stage_text(1, "training", 3, 8), stage_text(2, "scoring")
    ('step 1: sampling, 120/512 tokens', 'step 1: training, micro-batch 3/8', 'step 2: scoring')
    """
    counts = STAGE_COUNTS.get(stage, "{done}/{total}") if total else ""
    return f"step {step}: {stage}" + (f", {counts.format(done=done, total=total)}" if counts else "")


class StageLine:
    """The panel's line for the stage under way: rendered at each refresh, so a report per token
    costs an assignment."""

    def __init__(self) -> None:
        self.text = ""

    def __rich__(self) -> Text:
        return Text(self.text, style="dim")


class TrainingConsole:
    """A context manager, an observer and a `StageReport` (`stage`): the live panel lives from the
    first step to the end."""

    def __init__(
        self,
        total_steps: int,
        mode: str,
        console: Console | None = None,
        print_every: int = 10,
        completions_every: int = 0,
        completions_to_print: int = 0,
    ) -> None:
        self.console = console or stderr_console()
        self.mode = console_mode(mode, self.console)
        self.total_steps = total_steps
        self.print_every = print_every
        self.completions_every = completions_every
        self.completions_to_print = completions_to_print
        self.alerts: deque[tuple[int, str]] = deque(maxlen=ALERTS_SHOWN)
        self.repeats = AlertRepeats()  # an alert firing every step is printed a few times, then summarised
        self.last: StepResult | None = None
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("train", total=total_steps)
        self.stage_line = StageLine()
        self.live = Live(self._render(), console=self.console, refresh_per_second=4) if self.mode == "rich" else None
        self.heartbeat = Heartbeat("train", total_steps, "steps", self.mode == "plain")

    def __enter__(self) -> TrainingConsole:
        if self.live is not None:
            self.live.start()
        self.heartbeat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.__exit__(*exc)
        if self.live is not None:
            self.live.stop()
        for line in self.repeats.summary():  # what the quiet repeats were, once, in every mode
            self.console.print(f"[bold yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
            to_log_files(logging.WARNING, line)

    def resumed_at(self, step: int) -> None:
        """Steps a resumed run already has count towards done/total, not towards the ETA's rate."""
        self.heartbeat.done = self.heartbeat.start_done = step

    def stage(self, stage: str, done: int = 0, total: int = 0) -> None:
        """What the step under way is doing: the heartbeat's line (plain) and the panel (rich) say it."""
        self.heartbeat.stage = self.stage_line.text = stage_text(self.heartbeat.done + 1, stage, done, total)

    def on_step(self, result: StepResult) -> None:
        self.heartbeat.stage = self.stage_line.text = ""  # the step is finished
        for event in result.events:  # printed above the panel (or the lines), in every mode but quiet
            if self.mode != "quiet":
                shown = f"[bold cyan]step {result.step}:[/] {escape(event)}"
                self.console.print(shown, highlight=False, soft_wrap=True)
            to_log_files(logging.INFO, f"step {result.step}: {event}")
        for alert in result.alerts:  # printed above the panel (or the lines), in every mode; repeats sparingly
            note = self.repeats.note(result.step, alert)
            if note is not None:
                shown = f"[bold yellow]alert (step {result.step}{note}):[/] {escape(alert)}"
                self.console.print(shown, highlight=False, soft_wrap=True)
            to_log_files(logging.WARNING, f"alert (step {result.step}): {alert}")
            self.alerts.append((result.step, alert))
        self._print_completions(result)
        self.last = result
        self.heartbeat.done = result.step
        if self.mode == "rich":
            self.progress.update(self.task, completed=result.step)
            self.live.update(self._render())
        elif self.mode == "plain" and (
            result.step == 1 or result.step % self.print_every == 0 or result.step == self.total_steps
        ):
            figures = " ".join(f"{label} {value}" for label, value in key_figures(result.metrics))
            seconds = _fmt(result.metrics.get("time/step_s"), 2)
            line = f"step {result.step}/{self.total_steps} {figures} ({seconds}s, ETA {self.heartbeat.eta()})"
            self.console.print(line, highlight=False, soft_wrap=True)  # one line per step, however wide
            self.heartbeat.touch()

    def _print_completions(self, result: StepResult) -> None:
        due = completions_due(result.step, self.completions_every)
        if self.mode == "quiet" or not self.completions_to_print or not due:
            return
        for sample in result.samples[: self.completions_to_print]:
            rewards = " ".join(f"{name} {_fmt(value, 2)}" for name, value in sample["rewards"].items())
            self.console.print(
                Text.assemble(
                    (f"step {result.step} ", "dim"),
                    (repr(sample["prompt"][-60:]), "cyan"),
                    " -> ",
                    (repr(sample["completion"][:200]), "green"),
                    f"  reward {_fmt(sample['reward'], 2)} ({rewards}) advantage {_fmt(sample['advantage'], 2)}",
                ),
                soft_wrap=True,
            )
            if len(sample.get("messages") or []) > 1:  # a multi-turn completion: each turn under it
                for turn, message in enumerate(sample["messages"], 1):
                    role = (message.get("role") or "?", "bold" if message.get("role") == "assistant" else "yellow")
                    text = repr(str(message.get("content", ""))[:160])
                    self.console.print(Text.assemble(f"    {turn}. ", role, " ", text), soft_wrap=True)

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        if self.last is not None:
            figures = key_figures(self.last.metrics)
            for row in range(0, len(figures), 6):  # six figures a row: fits 100 columns
                cells = figures[row : row + 6]
                table.add_row(*(Text.assemble((f"{label} ", "dim"), (value, "bold")) for label, value in cells))
            masked = self.last.metrics.get("reward/masked_functions") or 0
            metrics = self.last.metrics
            failing = [
                f"{name} {metrics[f'reward/{name}/nan_frac']:.0%}"
                for name in reward_function_names(metrics)
                if metrics.get(f"reward/{name}/nan_frac")
            ]
            if failing or masked:
                style = "bold red" if masked else "yellow"
                table.add_row(Text(f"NaN: {', '.join(failing) or '-'}; masked functions: {masked}", style=style))
        alerts = [Text(f"step {step}: {alert}", style="bold yellow") for step, alert in self.alerts]
        return Group(self.progress, self.stage_line, table, *alerts)


def summary_table(summary: dict[str, Any], history: list[dict[str, Any]]) -> Table:
    table = Table(title="grpo train: summary", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("first 10 steps", justify="right")
    table.add_column("last 10 steps", justify="right")
    first, last = history[:10], history[-10:]
    keys = [k for k in history[0] if k.startswith("reward/") and k.endswith("mean")] if history else []
    keys += ["completion_len/mean", "frac_zero_std_groups", "kl", "clip_frac", "entropy", "diversity/distinct2_group"]
    for key in keys:

        def mean(rows: list[dict[str, Any]], key: str = key) -> str:
            value = column_mean(rows, key)
            return "-" if math.isnan(value) else f"{value:.4f}"

        table.add_row(key, mean(first), mean(last))
    table.caption = (
        f"{summary['steps']} steps in {summary['wall_s']:.1f}s; checkpoint: {summary.get('final_checkpoint')}"
    )
    return table
