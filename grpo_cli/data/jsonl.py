"""Local jsonl prompt files: one object per line, a prompt field plus any extra columns."""

from __future__ import annotations

import codecs
import json
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


def read_jsonl_prompts(path: str | Path, prompt_field: str) -> list[dict[str, Any]]:
    """Every row, with the prompt under `prompt` whatever the file calls it."""
    path = Path(path)
    rows = []
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
        rows.append({"prompt": prompt, **row})
    if not rows:
        raise GrpoError(f"{path}: no prompts (the file is empty)")
    return rows
