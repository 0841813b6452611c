"""The rollouts file `grpo rollout` writes and `grpo score` reads, written as a stream.

One JSON object per prompt: `index` (the prompt's position in the loaded data set: the key a
resume matches on), `prompt`, the data set's other columns, and `completions`, G objects
{text, token_count, finish_reason}. `token_count` includes the EOS, as training counts it (what
the `overlong` reward reads); `finish_reason` is "stop" (ended with EOS) or "length" (cut at
rollout.max_new_tokens, so token_count == max_new_tokens); a multi-turn completion (env.*) also
has `messages` and `env` (`trajectory_fields`). Each batch's records are appended and
flushed as soon as the batch is done, so a killed run keeps every finished prompt; a resume cuts a
half-written last line and appends what is missing. The settings that decide what the file holds
sit beside it in `<output>.meta.json`, written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from grpo_cli.config.dotted import flatten
from grpo_cli.data.jsonl import iter_jsonl
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Rollout

RESERVED_COLUMNS = ("index", "completions")  # keys of a record that are not data set columns
SCAN_BYTES = 1 << 16  # read backwards in these steps to find the last newline of a large file


def indexed_examples(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its position in the data set first; call before any split or filter, so the
    index names the same prompt whatever the split, skip policy or max_prompts."""
    for i, row in enumerate(examples):
        clash = [key for key in RESERVED_COLUMNS if key in row]
        if clash:
            raise GrpoError(
                f"data row {i} has a column named {clash[0]!r}, which a rollouts file uses for its own "
                f"field ({', '.join(RESERVED_COLUMNS)}): rename that column in the data"
            )
    return [{"index": i, **row} for i, row in enumerate(examples)]


def group_records(examples: list[dict[str, Any]], rollout: Rollout) -> list[dict[str, Any]]:
    """One record per prompt: its row and its group of completions (rows g*G .. g*G+G-1)."""
    lengths, truncated, size = rollout.lengths.tolist(), rollout.truncated.tolist(), rollout.group_size
    return [
        {
            **row,
            "completions": [
                {
                    "text": rollout.texts[i],
                    "token_count": lengths[i],
                    "finish_reason": "length" if truncated[i] else "stop",
                    **trajectory_fields(rollout, i),
                }
                for i in range(g * size, (g + 1) * size)
            ],
        }
        for g, row in enumerate(examples)
    ]


def trajectory_fields(rollout: Rollout, row: int) -> dict[str, Any]:
    """A multi-turn completion's conversation after the prompt (`messages`) and its environment's
    columns (`env`: what `grpo score` gives the reward functions again); nothing for one turn."""
    if rollout.messages is None:
        return {}
    return {"messages": rollout.messages[row], "env": {k: v[row] for k, v in (rollout.env_columns or {}).items()}}


def meta_path(output: Path) -> Path:
    return output.with_name(output.name + ".meta.json")


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Atomic: a kill mid-write leaves the previous meta file, never half of one."""
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _check_settings(output: Path, settings: dict[str, Any]) -> None:
    """A resume must sample as the file was sampled; otherwise the file mixes two distributions."""
    path = meta_path(output)
    if not path.is_file():
        raise GrpoError(
            f"rollout.resume=true: {path} is missing, so the settings {output} was written with are unknown; "
            "write a new output= instead"
        )
    try:
        saved = flatten(json.loads(path.read_text(encoding="utf-8"))["settings"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise GrpoError(f"{path}: not a grpo rollout meta file ({err})") from None
    now = flatten(settings)
    changed = [
        f"{key} (file {saved.get(key, '<absent>')!r}, now {now.get(key, '<absent>')!r})"
        for key in sorted(saved.keys() | now.keys())
        if saved.get(key, "<absent>") != now.get(key, "<absent>")
    ]
    if changed:
        raise GrpoError(
            f"rollout.resume=true: {output} was written with other settings: {'; '.join(changed)}. "
            "Resume with the file's settings, or write a new output="
        )


def _drop_partial_line(path: Path) -> int:
    """Cut the file after its last newline; returns the bytes cut (a write the kill interrupted)."""
    size = path.stat().st_size
    with path.open("rb+") as handle:
        end = size
        while end > 0:
            start = max(0, end - SCAN_BYTES)
            handle.seek(start)
            newline = handle.read(end - start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        handle.truncate(end)
    return size - end


class RolloutsFile:
    """The output, opened for appending. Without `resume` an existing file is an error (data is
    never overwritten); with it, the file's records are counted and their prompts skipped."""

    def __init__(self, path: Path, settings: dict[str, Any], resume: bool) -> None:
        self.path = Path(path)
        self.done: set[int] = set()  # indices of the prompts in the file
        self.completions = 0  # in the whole file, resumed lines included
        self.tokens = 0
        self.resumed = 0  # records found in the file at the start
        self.cut_bytes = 0  # a half-written last line, dropped
        if self.path.exists():
            if not resume:
                raise GrpoError(
                    f"output={self.path} already exists: add rollout.resume=true to continue it (the prompts it "
                    "holds are skipped), or choose another output="
                )
            _check_settings(self.path, settings)
            self._read_existing()
        self._handle: TextIO | None = None  # opened by the first append: a run that fails to start leaves no file

    def _read_existing(self) -> None:
        self.cut_bytes = _drop_partial_line(self.path)
        for lineno, row in iter_jsonl(self.path):
            index = row.get("index") if isinstance(row, dict) else None
            completions = row.get("completions") if isinstance(row, dict) else None
            if type(index) is not int or not isinstance(completions, list):
                raise GrpoError(
                    f"{self.path}:{lineno}: not a rollout record (needs an integer `index` and `completions`)"
                )
            if index in self.done:
                raise GrpoError(f"{self.path}:{lineno}: prompt index {index} is in the file twice")
            self._count(row)
        self.resumed = len(self.done)

    def _count(self, record: dict[str, Any]) -> None:
        self.done.add(record["index"])
        self.completions += len(record["completions"])
        self.tokens += sum(c.get("token_count") or 0 for c in record["completions"])

    def append(self, records: list[dict[str, Any]]) -> None:
        """Written and flushed to the OS before returning: a killed process keeps them."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        for record in records:
            self._handle.write(json.dumps(record) + "\n")
            self._count(record)
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()

    def __enter__(self) -> RolloutsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batch_seed(seed: int, batch: int) -> int:
    """Batch k's torch seed: a resumed run samples batch k exactly as an uninterrupted one."""
    return seed * 1_000_003 + batch


def stream_rollouts(
    examples: list[dict[str, Any]],
    generate: Callable[[list[dict[str, Any]]], Rollout],
    out: RolloutsFile,
    batch_size: int,
    seed: int,
    on_batch: Callable[[int, int], None] | None = None,
) -> None:
    """Generate and append every prompt of `examples` (rows from `indexed_examples`) not yet in `out`.

    Batches are fixed by position (batch k is examples[k*B:(k+1)*B]) and torch's global RNG is
    reseeded per batch, so the file is the same whether or not the run was killed and resumed: a
    batch with some prompts already in the file is generated whole and only the missing written.
    `on_batch(prompts, tokens)` is told what each batch added.
    """
    for k, start in enumerate(range(0, len(examples), batch_size)):
        batch = examples[start : start + batch_size]
        if all(row["index"] in out.done for row in batch):
            continue
        torch.manual_seed(batch_seed(seed, k))
        records = [r for r in group_records(batch, generate(batch)) if r["index"] not in out.done]
        out.append(records)
        if on_batch is not None:
            on_batch(len(records), sum(c["token_count"] for r in records for c in r["completions"]))
