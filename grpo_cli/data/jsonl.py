"""Local jsonl prompt files: one object per line, a prompt field plus any extra columns."""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError


def _is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def _decode_line(path: Path, lineno: int, raw: bytes) -> str:
    """One line as text, or a GrpoError naming the first byte that is not UTF-8 and its column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # The column counts characters, like JSON's, so it is where an editor puts the cursor.
        column = len(raw[: err.start].decode("utf-8")) + 1
        raise GrpoError(
            f"{path}:{lineno}: not UTF-8: byte 0x{raw[err.start]:02x} at column {column} (save the file as UTF-8)"
        ) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line, streamed.

    Errors name the file and the line, because a 100k-line file is not read by eye. Lines are
    read as bytes and decoded one at a time, so a stray Latin-1 byte is reported where it sits.
    """
    path = Path(path)
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]  # Windows editors write one; it is not part of the JSON
            line = _decode_line(path, lineno, raw)
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as err:
                raise GrpoError(f"{path}:{lineno}: malformed JSON: {err.msg} (column {err.colno})") from None


def _is_empty(prompt: str | list[dict[str, Any]]) -> bool:
    """Nothing for the model to answer: blank text, or a conversation with no text in any message."""
    if isinstance(prompt, str):
        return not prompt.strip()
    return not any(not isinstance(m["content"], str) or m["content"].strip() for m in prompt)  # parts: not empty


def _check_answer(path: Path, lineno: int, row: dict[str, Any]) -> None:
    """`answer` is the one reference answer the answer rewards (exact_match, last_number, math, ...)
    compare as text: a list, a mapping, null or NaN would never match, scoring 0 on every step."""
    if "answer" not in row:
        return
    answer = row["answer"]
    if answer is None:
        why = "is null"
    elif isinstance(answer, (list, dict, bool)):
        why = f"is a {type(answer).__name__}"
    elif isinstance(answer, float) and not math.isfinite(answer):
        why = "is not a finite number"
    else:
        return
    raise GrpoError(
        f"{path}:{lineno}: answer {answer!r} {why}: the answer column holds one reference answer, a string or a "
        "number, which the answer rewards compare as text (a reward of your own can read a list from another column)"
    )


def read_jsonl_prompts(path: str | Path, prompt_field: str) -> list[dict[str, Any]]:
    """Every row, with the prompt under `prompt` whatever the file calls it. Empty prompts are refused,
    all of them counted: the model would answer nothing (or nothing at all would be tokenised)."""
    path = Path(path)
    rows, empty = [], []  # empty: the line numbers of empty prompts
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise GrpoError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        if prompt_field not in row:
            raise GrpoError(f"{path}:{lineno}: missing prompt field '{prompt_field}' (set data.prompt_field)")
        prompt = row.pop(prompt_field)
        if not (isinstance(prompt, str) or _is_conversation(prompt)):
            raise GrpoError(
                f"{path}:{lineno}: field '{prompt_field}' must be a string or a list of {{role, content}} messages"
            )
        _check_answer(path, lineno, row)
        if _is_empty(prompt):
            empty.append(lineno)
        rows.append({"prompt": prompt, **row})
    if not rows:
        raise GrpoError(f"{path}: no prompts (the file is empty)")
    if empty:
        raise GrpoError(
            f"{path}:{empty[0]}: empty prompt (field '{prompt_field}'); {len(empty)} of {len(rows)} rows have one: "
            "remove them, or set data.prompt_field to the column that holds the prompts"
        )
    return rows
