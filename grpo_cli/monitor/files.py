"""Run files: one JSON line per step, sampled completions, and the final summary."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from grpo_cli.errors import GrpoError
from grpo_cli.monitor.observer import StepResult, completions_due

METRICS = "metrics.jsonl"  # in the run directory: one JSON object per finished step
log = logging.getLogger("grpo")


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN: a missing figure is null, never a string a parser chokes on."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):  # eval.json's greedy answers, one record each
        return [_finite_or_none(v) for v in value]
    return value


@contextmanager
def named_write_errors(path: Path) -> Iterator[None]:
    """A failed write (a full disk) carries no file name: give it this one, for the one-line error."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


class MetricsFile:
    """Appends and flushes each step, so a crash keeps every finished step. Opened on the first
    step, after setup: a resume first trims the lines of the steps it will run again."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle: IO[str] | None = None

    def on_step(self, result: StepResult) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        row = {k: _finite_or_none(v) for k, v in result.metrics.items()}
        with named_write_errors(self.path):
            self._handle.write(json.dumps(row) + "\n")
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class CompletionLog:
    """The first step's and then every `every` steps' sampled completions (`completions_due`), with
    rewards and advantages."""

    def __init__(self, directory: Path, every: int) -> None:
        self.directory = Path(directory)
        self.every = every

    def on_step(self, result: StepResult) -> None:
        if not completions_due(result.step, self.every):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"step_{result.step:06d}.jsonl"
        with named_write_errors(path), path.open("w", encoding="utf-8") as handle:
            for sample in result.samples:
                handle.write(json.dumps({k: _finite_or_none(v) for k, v in sample.items()}) + "\n")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Atomic: summary.json is what sweeps and CI read; never leave half of it."""
    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({k: _finite_or_none(v) for k, v in summary.items()}, indent=2) + "\n")
    os.replace(tmp, path)


def truncate_metrics(path: Path, last_step: int) -> list[dict[str, Any]]:
    """Drop metric lines past a resumed checkpoint (those steps run again); return the rest."""
    path = Path(path)
    if not path.exists():
        return []
    rows = read_metrics_rows(path.parent, path.name)  # a crash may have left half a last line: dropped
    kept = [row for row in rows if row.get("step", 0) <= last_step]
    if len(kept) < len(rows):  # never silently: e.g. a run killed with train.save_every=0 left no checkpoint
        last = max(row.get("step", 0) for row in rows)
        if last_step == 0:
            log.warning(
                "%s holds %d step(s) of an earlier run in this directory (up to step %d) but no checkpoint is "
                "resumed (none was saved, train.save_every=0 saving only at the end; or train.resume=never): "
                "this run starts over from step 0 and replaces them",
                path,
                len(rows) - len(kept),
                last,
            )
        else:
            log.warning(
                "%s: steps %d-%d run again from the checkpoint of step %d: their lines are replaced",
                path,
                last_step + 1,
                last,
                last_step,
            )
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    os.replace(tmp, path)
    return kept


def read_metrics_rows(run_dir: Path, name: str = METRICS) -> list[dict]:
    """A running run may be caught mid-write: its last line, if it has no newline yet, is skipped.
    Any other line that is not a JSON object is an error naming FILE:LINE."""
    path = Path(run_dir) / name
    if not path.is_file():
        raise GrpoError(f"{path}: not found; {run_dir} is not a run directory (or has not finished a step)")
    # bytes, then decode: the cut may fall inside a multibyte character of the last line
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):
                break  # written but not yet flushed to its newline
            raise GrpoError(f"{path}:{number}: not a JSON line ({err.msg})") from None
        if not isinstance(row, dict):
            raise GrpoError(f"{path}:{number}: not a JSON object")
        rows.append(row)
    return rows
