"""A data set's rows, whatever read them (a jsonl file, `datasets`), checked once and given the one
shape every later stage reads: the prompt under `prompt`, the reference answer under `answer`, and
every other column kept, to reach the reward functions as keyword arguments (as TRL passes them)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from grpo_cli.errors import GrpoError

ANSWER = "answer"  # the column the answer rewards (exact_match, last_number, math, ...) read


def is_conversation(prompt: Any) -> bool:
    """A list of {role, content} messages: rendered with the chat template, not tokenized as text."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def _is_empty(prompt: str | list[dict[str, Any]]) -> bool:
    """Nothing for the model to answer: blank text, or a conversation with no text in any message."""
    if isinstance(prompt, str):
        return not prompt.strip()
    return not any(not isinstance(m["content"], str) or m["content"].strip() for m in prompt)  # parts: not empty


def _take_answer(where: str, row: dict[str, Any], answer_field: str) -> None:
    """`data.answer_field` names the column holding the reference answer: it reaches the answer
    rewards as `answer`, and keeps its own name for a reward that reads it so (TRL's `solution`)."""
    if answer_field == ANSWER:
        return
    if answer_field not in row:
        raise GrpoError(f"{where}: missing answer field '{answer_field}' (set data.answer_field)")
    if ANSWER in row:  # two answers, one of them silently unused
        raise GrpoError(
            f"{where}: data.answer_field='{answer_field}', and the row has an '{ANSWER}' column too: "
            f"rename one, or drop data.answer_field"
        )
    row[ANSWER] = row[answer_field]


def _check_answer(where: str, row: dict[str, Any]) -> None:
    """`answer` is the one reference answer the answer rewards (exact_match, last_number, math, ...)
    compare as text: a list, a mapping, null or NaN would never match, scoring 0 on every step."""
    if ANSWER not in row:
        return
    answer = row[ANSWER]
    if answer is None:
        why = "is null"
    elif isinstance(answer, (list, dict, bool)):
        why = f"is a {type(answer).__name__}"
    elif isinstance(answer, float) and not math.isfinite(answer):
        why = "is not a finite number"
    else:
        return
    raise GrpoError(
        f"{where}: answer {answer!r} {why}: the answer column holds one reference answer, a string or a "
        "number, which the answer rewards compare as text (a reward of your own can read a list from another column)"
    )


def prompt_rows(
    rows: Iterable[tuple[str, Any]], source: str, prompt_field: str, answer_field: str = ANSWER
) -> list[dict[str, Any]]:
    """Every row, each given with where it is (`FILE:LINE`, `FILE (split S) row N`) for its errors,
    with the prompt under `prompt` whatever the data calls it. Empty prompts are refused, all of
    them counted: the model would answer nothing (or nothing at all would be tokenised)."""
    kept, empty = [], []  # empty: where each empty prompt is
    for where, row in rows:
        if not isinstance(row, dict):
            raise GrpoError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if prompt_field not in row:
            raise GrpoError(f"{where}: missing prompt field '{prompt_field}' (set data.prompt_field)")
        prompt = row.pop(prompt_field)
        if "prompt" in row:  # data.prompt_field names another column: this one would silently replace it
            raise GrpoError(
                f"{where}: data.prompt_field='{prompt_field}', and the row has a 'prompt' column too: "
                "rename one, or drop data.prompt_field"
            )
        if not (isinstance(prompt, str) or is_conversation(prompt)):
            raise GrpoError(f"{where}: field '{prompt_field}' must be a string or a list of {{role, content}} messages")
        _take_answer(where, row, answer_field)
        _check_answer(where, row)
        if _is_empty(prompt):
            empty.append(where)
        kept.append({"prompt": prompt, **row})
    if not kept:
        raise GrpoError(f"{source}: no prompts (the file is empty)")
    if empty:
        raise GrpoError(
            f"{empty[0]}: empty prompt (field '{prompt_field}'); {len(empty)} of {len(kept)} rows have one: "
            "remove them, or set data.prompt_field to the column that holds the prompts"
        )
    return kept
