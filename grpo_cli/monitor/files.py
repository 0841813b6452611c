"""Run files: one JSON line per step, sampled completions, and the final summary."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN: a missing figure is null, never a string a parser chokes on."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    return value


class MetricsFile:
    """Appends and flushes each step, so a crash keeps every finished step."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8")

    def __call__(self, metrics: dict[str, Any]) -> None:
        row = {k: _finite_or_none(v) for k, v in metrics.items() if not k.startswith("_")}
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


class CompletionLog:
    """Every `every` steps, the step's sampled completions with rewards and advantages."""

    def __init__(self, directory: Path, every: int) -> None:
        self.directory = Path(directory)
        self.every = every

    def __call__(self, metrics: dict[str, Any]) -> None:
        if not self.every or metrics["step"] % self.every:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"step_{metrics['step']:06d}.jsonl"
        with path.open("w", encoding="utf-8") as handle:
            for sample in metrics.get("_samples", []):
                handle.write(json.dumps({k: _finite_or_none(v) for k, v in sample.items()}) + "\n")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Atomic: summary.json is what sweeps and CI read; never leave half of it."""
    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({k: _finite_or_none(v) for k, v in summary.items()}, indent=2) + "\n")
    os.replace(tmp, path)
