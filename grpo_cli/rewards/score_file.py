"""Score a rollouts file in a stream: one batch of prompts in memory, whatever the file size.

Input: one JSON object per prompt with `prompt`, its dataset columns and `completions`, a list of
{text, token_count, finish_reason}. Output: the same objects with `rewards` (function -> value,
null where it failed), `reward` (fused, null when unscorable) and `advantage` added to each
completion. The output is written to a temporary file and renamed at the end, so a crash never
leaves a half-scored file under the final name.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo_cli.core.advantages import group_advantages
from grpo_cli.data.jsonl import iter_jsonl
from grpo_cli.errors import GrpoError
from grpo_cli.rewards.executor import RewardExecutor
from grpo_cli.rewards.fusion import RewardFusion
from grpo_cli.rewards.sources import RewardSource


@dataclass
class RunningStats:
    """Welford mean/std over finite values, plus a NaN count: constant memory per function."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    nan_count: int = 0

    def add(self, value: float) -> None:
        if value is None or math.isnan(value):
            self.nan_count += 1
            return
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def as_dict(self) -> dict[str, Any]:
        std = math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0
        return {
            "mean": self.mean if self.count else None,
            "std": std,
            "count": self.count,
            "nan_count": self.nan_count,
        }


@dataclass
class WeightEffect:
    """Streaming Cov(x_i, R) / Var(R) over every scorable completion of the file."""

    n: int = 0
    sum_r: float = 0.0
    sum_rr: float = 0.0
    sum_x: dict[str, float] = field(default_factory=dict)
    sum_xr: dict[str, float] = field(default_factory=dict)

    def add(self, contributions: dict[str, float], fused: float) -> None:
        self.n += 1
        self.sum_r += fused
        self.sum_rr += fused * fused
        for name, x in contributions.items():
            self.sum_x[name] = self.sum_x.get(name, 0.0) + x
            self.sum_xr[name] = self.sum_xr.get(name, 0.0) + x * fused

    def shares(self) -> dict[str, float]:
        if self.n < 2:
            return {}
        mean_r = self.sum_r / self.n
        var_r = self.sum_rr / self.n - mean_r**2
        if var_r <= 1e-12:
            return {}
        return {
            name: (self.sum_xr[name] / self.n - (self.sum_x[name] / self.n) * mean_r) / var_r for name in self.sum_x
        }


def _read_groups(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict) or "prompt" not in row or not isinstance(row.get("completions"), list):
            raise GrpoError(f"{path}:{lineno}: expected an object with `prompt` and a `completions` list")
        for i, completion in enumerate(row["completions"]):
            if isinstance(completion, str):
                row["completions"][i] = completion = {"text": completion}
            if not isinstance(completion, dict) or not isinstance(completion.get("text"), str):
                raise GrpoError(f"{path}:{lineno}: completion {i} needs a `text` string")
        yield lineno, row


def _batches(path: Path, batch_size: int) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    batch: list[tuple[int, dict[str, Any]]] = []
    for item in _read_groups(path):
        batch.append(item)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def score_rollouts_file(
    input_path: Path,
    output_path: Path,
    sources: list[RewardSource],
    fusion: RewardFusion,
    executor: RewardExecutor,
    scale_rewards: str = "group",
    batch_size: int = 64,
) -> dict[str, Any]:
    """Returns the summary (also what `score_summary.json` holds)."""
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise GrpoError(f"input={input_path}: no such file")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_path.with_name(f".{output_path.name}.partial")
    per_function = {s.name: RunningStats() for s in sources}
    fused_stats = RunningStats()
    effect = WeightEffect()
    alerts: list[str] = []
    prompts_seen = completions_seen = zero_std_groups = 0
    group_size = None
    masked: list[str] = []
    with tmp.open("w", encoding="utf-8") as out:
        for batch in _batches(input_path, batch_size):
            for lineno, row in batch:
                if group_size is None:
                    group_size = len(row["completions"])
                    if group_size < 1:
                        raise GrpoError(f"{input_path}:{lineno}: no completions")
                if len(row["completions"]) != group_size:
                    raise GrpoError(
                        f"{input_path}:{lineno}: {len(row['completions'])} completions, expected {group_size} "
                        "(every prompt needs the same group size)"
                    )
            rows = [row for _, row in batch]
            prompts = [row["prompt"] for row in rows for _ in range(group_size)]
            texts = [c["text"] for row in rows for c in row["completions"]]
            column_names = sorted({k for row in rows for k in row if k not in ("prompt", "completions")})
            columns = {k: [row.get(k) for row in rows for _ in range(group_size)] for k in column_names}
            columns["completion_lengths"] = [
                c.get("token_count", len(c["text"])) for row in rows for c in row["completions"]
            ]
            scores = executor.run(sources, prompts, texts, columns)
            result = fusion.fuse(scores, group_size)
            alerts.extend(result.alerts)
            masked = list(result.masked)
            fused = torch.tensor(result.fused, dtype=torch.float64)
            advantages, adv_stats = group_advantages(fused, group_size, scale_rewards)
            zero_std_groups += round(adv_stats.frac_zero_std_groups * len(rows))
            for i in range(len(texts)):
                row, completion = rows[i // group_size], rows[i // group_size]["completions"][i % group_size]
                values = {name: result.per_function[name][i] for name in result.per_function}
                for name, value in values.items():
                    per_function[name].add(value)
                fused_value = result.fused[i]
                fused_stats.add(fused_value)
                if not math.isnan(fused_value):
                    effect.add({name: xs[i] for name, xs in result.contributions.items()}, fused_value)
                completion["rewards"] = {k: (None if math.isnan(v) else v) for k, v in values.items()}
                completion["reward"] = None if math.isnan(fused_value) else fused_value
                completion["advantage"] = advantages[i].item()
            for row in rows:
                out.write(json.dumps(row) + "\n")
            prompts_seen += len(rows)
            completions_seen += len(texts)
    os.replace(tmp, output_path)
    return {
        "input": str(input_path),
        "output": str(output_path),
        "prompts": prompts_seen,
        "completions": completions_seen,
        "group_size": group_size,
        "reward": fused_stats.as_dict(),
        "unscorable": fused_stats.nan_count,
        "frac_zero_std_groups": zero_std_groups / prompts_seen if prompts_seen else None,
        "functions": {name: stats.as_dict() for name, stats in per_function.items()},
        "masked_functions": masked,
        "alerts": alerts,
        "weight_effect": effect.shares(),
    }
