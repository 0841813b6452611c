"""Prompt sources: the seeded arithmetic task, the train/eval split, the sampler, jsonl files."""

from __future__ import annotations

import json
import logging
import operator
import re
from pathlib import Path

import pytest

from grpo_cli.config.schema import DataConfig
from grpo_cli.data import PromptSampler, load_examples, split_examples
from grpo_cli.data.arithmetic import arithmetic_examples
from grpo_cli.data.jsonl import read_jsonl_prompts
from grpo_cli.errors import GrpoError

PROBLEM = re.compile(r"^(\d+)([+\-*])(\d+)=$")
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---- arithmetic -------------------------------------------------------------------------------
def test_arithmetic_same_seed_same_list() -> None:
    a = arithmetic_examples(50, 9, ["+", "-", "*"], seed=3)
    b = arithmetic_examples(50, 9, ["+", "-", "*"], seed=3)
    assert a == b
    assert len(a) == 50


def test_arithmetic_different_seed_different_order_same_problems() -> None:
    # 6 * 6 = 36 problems exist; asking for more returns all of them, in a seeded order.
    a = arithmetic_examples(1000, 5, ["+"], seed=0)
    b = arithmetic_examples(1000, 5, ["+"], seed=1)
    assert len(a) == len(b) == 36
    assert a != b
    assert sorted(a, key=lambda e: e["prompt"]) == sorted(b, key=lambda e: e["prompt"])


@pytest.mark.parametrize("operations", [["+"], ["-"], ["*"], ["+", "-", "*"]])
def test_arithmetic_distinct_and_correct(operations: list[str]) -> None:
    examples = arithmetic_examples(300, 12, operations, seed=7)
    prompts = [e["prompt"] for e in examples]
    assert len(set(prompts)) == len(prompts), "problems must be distinct"
    for example in examples:
        match = PROBLEM.match(example["prompt"])
        assert match, example
        a, op, b = int(match[1]), match[2], int(match[3])
        assert op in operations
        assert 0 <= a <= 12 and 0 <= b <= 12
        assert example["answer"] == str(OPS[op](a, b)), example


def test_arithmetic_unknown_operation_is_a_user_error() -> None:
    with pytest.raises(GrpoError, match="/"):
        arithmetic_examples(10, 5, ["+", "/"], seed=0)


# ---- split ------------------------------------------------------------------------------------
@pytest.mark.parametrize("eval_fraction", [0.0, 0.1, 0.25, 0.5])
def test_split_has_no_overlap_and_covers_everything(eval_fraction: float) -> None:
    examples = arithmetic_examples(200, 20, ["+"], seed=0)
    train, held_out = split_examples(examples, eval_fraction, seed=0)
    train_prompts = {e["prompt"] for e in train}
    eval_prompts = {e["prompt"] for e in held_out}
    assert not train_prompts & eval_prompts
    assert train_prompts | eval_prompts == {e["prompt"] for e in examples}
    assert len(train) + len(held_out) == len(examples)
    assert len(held_out) == int(len(examples) * eval_fraction)


def test_split_is_seeded() -> None:
    examples = arithmetic_examples(100, 20, ["+"], seed=0)
    assert split_examples(examples, 0.2, seed=5) == split_examples(examples, 0.2, seed=5)
    assert split_examples(examples, 0.2, seed=5)[1] != split_examples(examples, 0.2, seed=6)[1]


@pytest.mark.parametrize(("rows", "eval_fraction", "warned"), [(40, 0.05, True), (200, 0.05, False), (40, 0.0, False)])
def test_a_held_out_side_of_a_few_prompts_is_said_out_loud(
    rows: int, eval_fraction: float, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A 40-row file at data=jsonl's 0.05 held out 2 prompts and said nothing; the split is unchanged."""
    examples = arithmetic_examples(rows, 20, ["+"], seed=0)
    with caplog.at_level(logging.WARNING, logger="grpo"):
        _, held_out = split_examples(examples, eval_fraction, seed=0)
    assert len(held_out) == int(rows * eval_fraction)
    said = [r.getMessage() for r in caplog.records]
    if warned:
        assert said == [
            "data.eval_fraction=0.05 holds out 2 of 40 examples: an accuracy over them moves in steps of 50%; "
            "raise data.eval_fraction for 10 or more, or set it to 0 to train on all 40"
        ]
    else:
        assert said == []


def test_split_keeps_at_least_one_training_example() -> None:
    examples = arithmetic_examples(3, 5, ["+"], seed=0)
    train, held_out = split_examples(examples, 0.99, seed=0)
    assert len(train) >= 1
    assert len(train) + len(held_out) == 3


def test_load_examples_applies_fraction_and_cap() -> None:
    full = load_examples(DataConfig(kind="arithmetic", num_examples=100, max_operand=20))
    assert len(full) == 100
    half = load_examples(DataConfig(kind="arithmetic", num_examples=100, max_operand=20, fraction=0.5))
    assert half == full[:50]
    capped = load_examples(DataConfig(kind="arithmetic", num_examples=100, max_operand=20, max_examples=7))
    assert capped == full[:7]


# ---- sampler ----------------------------------------------------------------------------------
def _examples(n: int = 10) -> list[dict]:
    return [{"prompt": f"p{i}", "answer": str(i)} for i in range(n)]


def test_sampler_is_repeatable() -> None:
    a, b = PromptSampler(_examples(), seed=1), PromptSampler(_examples(), seed=1)
    assert [a.next_batch(3) for _ in range(8)] == [b.next_batch(3) for _ in range(8)]


def test_sampler_seed_changes_the_order() -> None:
    a, b = PromptSampler(_examples(), seed=1), PromptSampler(_examples(), seed=2)
    assert [a.next_batch(5) for _ in range(4)] != [b.next_batch(5) for _ in range(4)]


def test_sampler_visits_every_example_once_per_epoch() -> None:
    examples = _examples(10)
    sampler = PromptSampler(examples, seed=0)
    first_epoch = sampler.next_batch(10)
    second_epoch = sampler.next_batch(10)
    assert sorted(e["prompt"] for e in first_epoch) == sorted(e["prompt"] for e in examples)
    assert sorted(e["prompt"] for e in second_epoch) == sorted(e["prompt"] for e in examples)
    assert first_epoch != second_epoch  # a new permutation per epoch


@pytest.mark.parametrize("drawn", [0, 1, 3, 7])
def test_sampler_state_dict_round_trips(drawn: int) -> None:
    """A resumed sampler continues with exactly the batches the original would have given,
    including across epoch boundaries (batch 3 and 10 do not divide 10 examples evenly)."""
    original = PromptSampler(_examples(), seed=4)
    for _ in range(drawn):
        original.next_batch(3)
    state = json.loads(json.dumps(original.state_dict()))  # checkpoints store it as JSON
    expected = [original.next_batch(3) for _ in range(5)] + [original.next_batch(10)]

    resumed = PromptSampler(_examples(), seed=4)
    resumed.load_state_dict(state)
    assert [resumed.next_batch(3) for _ in range(5)] + [resumed.next_batch(10)] == expected


# ---- jsonl ------------------------------------------------------------------------------------
def test_jsonl_keeps_extra_columns(tmp_path: Path) -> None:
    rows = [
        {"prompt": "1+1=", "answer": "2", "id": 7, "meta": {"source": "unit", "tags": ["a"]}},
        {"prompt": "2+2=", "answer": "4", "id": 8, "meta": {"source": "unit", "tags": []}},
    ]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    assert read_jsonl_prompts(path, "prompt") == rows
    examples = load_examples(DataConfig(kind="jsonl", path=str(path)))
    assert examples == rows


def test_jsonl_custom_prompt_field_is_renamed_to_prompt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "3+4=", "answer": "7"}])
    assert read_jsonl_prompts(path, "question") == [{"prompt": "3+4=", "answer": "7"}]


def test_jsonl_conversational_prompts_accepted(tmp_path: Path) -> None:
    chat = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": chat, "answer": "5"}, {"prompt": "plain", "answer": "1"}])
    rows = read_jsonl_prompts(path, "prompt")
    assert rows[0] == {"prompt": chat, "answer": "5"}
    assert rows[1] == {"prompt": "plain", "answer": "1"}


def test_jsonl_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n', encoding="utf-8")
    assert [r["prompt"] for r in read_jsonl_prompts(path, "prompt")] == ["a", "b"]


@pytest.mark.parametrize(
    ("lines", "where", "what"),
    [
        (['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": oops'], ":3:", "malformed"),
        (['{"prompt": "a"}', '["not", "an", "object"]'], ":2:", "object"),
        (['{"question": "a"}'], ":1:", "prompt"),
        (['{"prompt": "a"}', '{"prompt": ["just", "strings"]}'], ":2:", "role"),
        (['{"prompt": 42}'], ":1:", "prompt"),
    ],
    ids=["malformed", "not-an-object", "missing-field", "bad-conversation", "number-prompt"],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, lines: list[str], where: str, what: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(GrpoError) as info:
        read_jsonl_prompts(path, "prompt")
    assert f"{path}{where}" in str(info.value)
    assert what in str(info.value)


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "only-blank-lines"])
def test_jsonl_without_prompts_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(GrpoError, match="empty"):
        read_jsonl_prompts(path, "prompt")
