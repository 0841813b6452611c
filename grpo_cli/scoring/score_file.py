"""Score a rollouts file in a stream: one batch of prompts in memory, whatever the file size.

Input: one JSON object per prompt with `prompt`, its dataset columns and `completions`, a list of
{text, token_count, finish_reason}. Output: the same objects with `rewards` (function -> value,
null where it failed), `reward` (fused, null when unscorable) and `advantage` added to each
completion. The output is written to a temporary file and renamed at the end, so a crash never
leaves a half-scored file under the final name; a failure removes the temporary file, so none is
left beside it either.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import torch

from grpo_cli.core.advantages import group_advantages
from grpo_cli.data.jsonl import iter_jsonl
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import FusionResult, RewardBatch, RewardExecutor, RewardFusion, score_and_fuse
from grpo_cli.rewards.scoring import with_environment_columns
from grpo_cli.rewards.sources import uses_completion_lengths
from grpo_cli.rewards.trl_style import multi_turn_columns
from grpo_cli.stats import WeightEffect, Welford


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


def _batches(path: Path, batch_size: int, max_prompts: int = 0) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    """`max_prompts` > 0 stops reading there: the rest of the file is never parsed."""
    batch: list[tuple[int, dict[str, Any]]] = []
    for seen, item in enumerate(_read_groups(path), start=1):
        batch.append(item)
        if len(batch) == batch_size or seen == max_prompts:
            yield batch
            batch = []
        if seen == max_prompts:
            return
    if batch:
        yield batch


def _completion_lengths(
    path: Path,
    batch: list[tuple[int, dict[str, Any]]],
    count_tokens: Callable[[str], int] | None,
    readers: list[str],
) -> list[int | None]:
    """Token counts as training passes them: the file's `token_count`, else the tokenizer's count.

    Characters are not tokens (about 4 per token for English BPE), so a length-reading reward
    such as `overlong` without either is an error, not a silent 4x early penalty.
    """
    lengths: list[int | None] = []
    for lineno, row in batch:
        for i, completion in enumerate(row["completions"]):
            count = completion.get("token_count")
            if count is None and count_tokens is not None:
                count = count_tokens(completion["text"])
            if count is None and readers:
                raise GrpoError(
                    f"{path}:{lineno}: completion {i} has no token_count, which reward(s) {readers} read: "
                    "add token_count to the file, or set tokenizer=DIR (a local model or tokenizer directory)"
                )
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
                raise GrpoError(f"{path}:{lineno}: completion {i}: token_count must be a non-negative integer")
            lengths.append(count)
    return lengths


def scored_batches(
    input_path: Path,
    fusion: RewardFusion,
    executor: RewardExecutor,
    batch_size: int = 64,
    count_tokens: Callable[[str], int] | None = None,
    update_state: bool = True,
    grouped: bool = True,
    max_prompts: int = 0,
) -> Iterator[tuple[list[dict[str, Any]], RewardBatch, FusionResult]]:
    """The file's prompts, `batch_size` at a time, each batch scored as training scores one: the
    one reader of the rollouts contract, for `grpo score` and `grpo eval input=FILE`.

    Yields (rows, their RewardBatch, its FusionResult). `update_state` and `grouped` as in
    `score_and_fuse`: eval passes False for both (no running statistics, no group z-scores);
    `max_prompts` > 0 reads only the file's first prompts.
    """
    input_path = Path(input_path)
    if not input_path.is_file():
        raise GrpoError(f"input={input_path}: no such file")
    readers = uses_completion_lengths(fusion.sources)
    group_size = None
    for batch in _batches(input_path, batch_size, max_prompts):
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
        reward_batch = RewardBatch.from_groups(
            rows,
            [c["text"] for row in rows for c in row["completions"]],
            _completion_lengths(input_path, batch, count_tokens, readers),
            group_size,
            exclude=("completions",),
        )
        completions = [c for row in rows for c in row["completions"]]
        names = dict.fromkeys(name for c in completions for name in (c.get("env") or {}))
        env_columns = {name: [(c.get("env") or {}).get(name) for c in completions] for name in names}
        combine = with_environment_columns(reward_batch, env_columns, None)  # a multi-turn rollout's columns
        if completions and all("messages" in c for c in completions):  # its conversations, for TRL-style rewards
            reward_batch.columns.update(multi_turn_columns([c["messages"] for c in completions], None))
        result = score_and_fuse(
            executor, fusion, reward_batch, update_state=update_state, grouped=grouped, combine=combine
        )
        yield rows, reward_batch, result


def score_rollouts_file(
    input_path: Path,
    output_path: Path,
    fusion: RewardFusion,
    executor: RewardExecutor,
    scale_rewards: str = "group",
    batch_size: int = 64,
    count_tokens: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    """Returns the summary (also what `score_summary.json` holds). `count_tokens` counts the
    tokens of completions that carry no `token_count`."""
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise GrpoError(f"input={input_path}: no such file")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_path.with_name(f".{output_path.name}.partial")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            summary = _score_into(out, input_path, fusion, executor, scale_rewards, batch_size, count_tokens)
    except BaseException:  # a bad line, a crash or Ctrl-C: no half-scored file left beside the output
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, output_path)
    return {"input": str(input_path), "output": str(output_path), **summary}


def _score_into(
    out: TextIO,
    input_path: Path,
    fusion: RewardFusion,
    executor: RewardExecutor,
    scale_rewards: str,
    batch_size: int,
    count_tokens: Callable[[str], int] | None,
) -> dict[str, Any]:
    per_function = {s.name: Welford() for s in fusion.sources}
    fused_stats = Welford()
    effect = WeightEffect()
    alerts: list[str] = []
    prompts_seen = completions_seen = zero_std_groups = 0
    group_size = None
    masked: list[str] = []
    for rows, reward_batch, result in scored_batches(input_path, fusion, executor, batch_size, count_tokens):
        group_size = reward_batch.group_size
        alerts.extend(result.alerts)
        masked = list(result.masked)
        fused = torch.tensor(result.fused, dtype=torch.float64)
        advantages, adv_stats = group_advantages(fused, group_size, scale_rewards)
        zero_std_groups += round(adv_stats.frac_zero_std_groups * len(rows))
        for i in range(len(reward_batch)):
            completion = rows[i // group_size]["completions"][i % group_size]
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
        completions_seen += len(reward_batch)
    return {
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
