"""Progress of a pass over prompts (`grpo rollout`, `grpo eval`): prompts done of the total, and tokens/s.

The modes are `monitor.console`'s: a rich bar on a terminal, a plain line every tenth of the
work (and the last) in CI logs and files, with a `Heartbeat` line between them whenever 30 s
pass without one; nothing when quiet.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from grpo_cli.monitor.console import console_mode
from grpo_cli.monitor.heartbeat import Heartbeat
from grpo_cli.monitor.terminal import stderr_console

PLAIN_LINES = 10  # a plain log gets about this many progress lines, whatever the total


class PromptProgress:
    """A context manager; `advance(prompts, tokens)` after each batch. `done` prompts (a resume)
    count towards the bar but not towards tokens/s."""

    def __init__(self, label: str, total: int, mode: str, console: Console | None = None, done: int = 0) -> None:
        self.console = console or stderr_console()
        self.mode = console_mode(mode, self.console)
        self.label = label
        self.total = total
        self.done = done
        self.tokens = 0
        self.start = time.perf_counter()
        self._next_line = 0  # plain mode: print when `done` reaches this
        self.progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("prompts {task.fields[rate]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=self.mode != "rich",
        )
        self.task = self.progress.add_task(label, total=total, completed=done, rate="-")
        self.heartbeat = Heartbeat(label, total, "prompts", self.mode == "plain", done)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)

    def __enter__(self) -> PromptProgress:
        self.progress.start()
        self.heartbeat.__enter__()
        self._next_line = self.done + max(1, self.total // PLAIN_LINES)
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.__exit__(*exc)
        self.progress.stop()

    def advance(self, prompts: int, tokens: int) -> None:
        self.done += prompts
        self.tokens += tokens
        self.heartbeat.advance(prompts)
        rate = f"{self.tokens_per_s:.0f}"
        self.progress.update(self.task, completed=self.done, rate=rate)
        if self.mode == "plain" and (self.done >= self._next_line or self.done == self.total):
            elapsed = time.perf_counter() - self.start
            eta = self.heartbeat.eta()
            line = f"{self.label} {self.done}/{self.total} prompts, {rate} tok/s, {elapsed:.1f}s, ETA {eta}"
            self.console.print(line, highlight=False, soft_wrap=True)
            self.heartbeat.touch()
            self._next_line = self.done + max(1, self.total // PLAIN_LINES)
