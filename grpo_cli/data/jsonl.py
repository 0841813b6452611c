"""Local jsonl prompt files: one object per line, a prompt field plus any extra columns."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_cli.data.rows import ANSWER, prompt_rows
from grpo_cli.errors import GrpoError


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


def read_jsonl_prompts(path: str | Path, prompt_field: str, answer_field: str = ANSWER) -> list[dict[str, Any]]:
    """Every row, checked and shaped as every data source's rows are (grpo_cli/data/rows.py); errors
    name the file and the line."""
    path = Path(path)
    rows = ((f"{path}:{lineno}", row) for lineno, row in iter_jsonl(path))
    return prompt_rows(rows, str(path), prompt_field, answer_field)
