"""The packaged math word problems: every one loads, has a numeric answer, and `math` grades it."""

from __future__ import annotations

import json
from fractions import Fraction
from importlib.resources import files

import pytest

from grpo_cli.config.checks import CHOICES
from grpo_cli.config.schema import DataConfig
from grpo_cli.data import load_examples, split_examples
from grpo_cli.rewards.math_answer import math_answer
from tests.conftest import read_metrics, run_grpo

EXAMPLES = load_examples(DataConfig(kind="math"))


def _wrong(answer: str) -> str:
    """A nearby wrong number in the same form: off by one for integers, by a small step otherwise."""
    value = Fraction(answer)
    if "/" in answer:
        wrong = value + Fraction(1, value.denominator)
        return f"{wrong.numerator}/{wrong.denominator}"
    if "." in answer:
        step = Fraction(1, 10 ** len(answer.split(".")[1]))
        return str(float(value + step))
    return str(value + 1)


def test_math_is_a_data_kind() -> None:
    assert "math" in CHOICES["data.kind"]


def test_file_ships_inside_the_package() -> None:
    resource = files("grpo_cli.data") / "math_problems.jsonl"
    lines = [line for line in resource.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == len(EXAMPLES) >= 60
    assert all(json.loads(line).keys() == {"prompt", "answer"} for line in lines)


def test_every_problem_is_a_chat_prompt_with_the_same_system_message() -> None:
    systems = set()
    for example in EXAMPLES:
        system, user = example["prompt"]
        assert system["role"] == "system" and user["role"] == "user"
        assert user["content"].strip().endswith("?") or user["content"].strip().endswith(".")
        systems.add(system["content"])
    assert len(systems) == 1
    (system,) = systems
    assert "<think></think>" in system and "<answer></answer>" in system


def test_questions_are_distinct() -> None:
    questions = [example["prompt"][1]["content"] for example in EXAMPLES]
    assert len(set(questions)) == len(questions)


def test_every_answer_is_a_number_and_the_mix_has_all_three_forms() -> None:
    forms = {"integer": 0, "decimal": 0, "fraction": 0}
    for example in EXAMPLES:
        answer = example["answer"]
        assert isinstance(answer, str)
        value = Fraction(answer)  # raises on anything that is not an integer, decimal or a/b
        if "/" in answer:
            forms["fraction"] += 1
            assert value.denominator != 1 and answer == f"{value.numerator}/{value.denominator}", answer
        elif "." in answer:
            forms["decimal"] += 1
            assert not answer.endswith("0"), answer  # canonical: no trailing zeros
        else:
            forms["integer"] += 1
    assert min(forms.values()) >= 8, forms


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["answer"] for e in EXAMPLES])
def test_math_grades_the_reference_right_and_a_near_miss_wrong(example: dict) -> None:
    answer = example["answer"]
    completions = [
        f"<think>working it out</think><answer>{answer}</answer>",
        f"<think>working it out</think><answer>{_wrong(answer)}</answer>",
    ]
    assert math_answer([example["prompt"]] * 2, completions, answer=[answer] * 2) == [1.0, 0.0]


def test_loading_respects_the_usual_data_knobs() -> None:
    assert len(load_examples(DataConfig(kind="math", max_examples=5))) == 5
    assert len(load_examples(DataConfig(kind="math", fraction=0.5))) == len(EXAMPLES) // 2
    train, held_out = split_examples(EXAMPLES, 0.1, seed=0)
    assert len(held_out) == int(len(EXAMPLES) * 0.1) and len(train) + len(held_out) == len(EXAMPLES)


def test_smoke_run_with_math_data_and_reward(tmp_path) -> None:
    run_dir = tmp_path / "math_smoke"
    result = run_grpo("train", "data=math", "reward=math", "debug=smoke", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run_dir)
    assert metrics, "no metrics written"
    # a random tiny model never answers right, but every completion must be scorable (gold parses)
    assert all(m.get("reward/math/nan_frac", 0.0) == 0.0 for m in metrics if "reward/math/nan_frac" in m)
