"""Data a new user gets wrong (issue 52): each refused in one line naming the key, or the file and
line, instead of a traceback, a message blaming another key, or a run on prompts that are not there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_cli.config.schema import DataConfig
from grpo_cli.data import load_examples
from grpo_cli.errors import GrpoError


def write_jsonl(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"max_operand": -1}, r"invalid value data\.max_operand=-1: must be >= 0"),
        ({"operations": []}, r"invalid value data\.operations=\[\]: must name at least one of \+, -, \*"),
        ({"num_examples": 0}, r"invalid value data\.num_examples=0: must be at least 1"),
        ({"num_examples": -3}, r"invalid value data\.num_examples=-3: must be at least 1"),
        ({"max_examples": -1}, r"invalid value data\.max_examples=-1: must be >= 0 \(0: all\)"),
    ],
)
def test_an_arithmetic_setting_that_selects_nothing_is_named_not_prompts_per_step(setting: dict, says: str) -> None:
    with pytest.raises(GrpoError, match=says) as err:
        load_examples(DataConfig(**setting))
    assert "prompts_per_step" not in str(err.value)
    assert len(load_examples(DataConfig(max_operand=0, num_examples=1, operations=["*"]))) == 1  # 0*0=: the least


@pytest.mark.parametrize(
    ("lines", "where", "how_many"),
    [
        ('{"prompt": "", "answer": "1"}\n{"prompt": "", "answer": "2"}\n', 1, "2 of 2"),  # was a reshape traceback
        ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "  \\n", "answer": "4"}\n{"prompt": ""}\n', 2, "2 of 3"),
        ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": [], "answer": "4"}\n', 2, "1 of 2"),
        ('{"prompt": [{"role": "user", "content": ""}], "answer": "4"}\n', 1, "1 of 1"),
    ],
)
def test_empty_prompts_are_refused_naming_the_first_line_and_how_many(
    tmp_path: Path, lines: str, where: int, how_many: str
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", lines)
    says = rf"^{re.escape(str(path))}:{where}: empty prompt \(field 'prompt'\); {how_many} rows have one: "
    with pytest.raises(GrpoError, match=says):
        load_examples(DataConfig(kind="jsonl", path=str(path)))


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (["4", "four"], r"answer \['4', 'four'\] is a list"),  # str() of it never equals an answer: 0 forever
        ({"value": 4}, r"answer \{'value': 4\} is a dict"),
        (None, r"answer None is null"),
        ("NaN", r"answer nan is not a finite number"),  # json reads a bare NaN
        ("Infinity", r"answer inf is not a finite number"),
    ],
)
def test_an_answer_no_reward_can_match_is_refused_naming_the_line(tmp_path: Path, answer: object, says: str) -> None:
    value = answer if answer in ("NaN", "Infinity") else json.dumps(answer)
    path = write_jsonl(
        tmp_path / "rows.jsonl", f'{{"prompt": "1+1=", "answer": "2"}}\n{{"prompt": "2+2=", "answer": {value}}}\n'
    )
    with pytest.raises(GrpoError, match=rf"^{re.escape(str(path))}:2: {says}"):
        load_examples(DataConfig(kind="jsonl", path=str(path)))


def test_answers_that_are_text_or_finite_numbers_load(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "rows.jsonl",
        '{"prompt": "a", "answer": "2"}\n{"prompt": "b", "answer": 1500}\n'
        '{"prompt": "c", "answer": 0.5}\n{"prompt": "d", "tests": ["x"]}\n',
    )
    assert [row.get("answer") for row in load_examples(DataConfig(kind="jsonl", path=str(path)))] == [
        "2",
        1500,
        0.5,
        None,
    ]
