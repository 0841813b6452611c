"""The packaged code tasks: every one loads, carries one test shape, and reward=code selects them.

That each reference passes its own tests in the sandbox is checked in
tests/rewards/code/test_code_rewards.py, next to the reward that runs them.
"""

from __future__ import annotations

import ast
import json
from importlib.resources import files

from hydra import compose, initialize_config_module

from grpo_cli.commands.entry import register_schemas
from grpo_cli.config.checks import CHOICES
from grpo_cli.config.schema import DataConfig
from grpo_cli.data import load_examples, split_examples

EXAMPLES = load_examples(DataConfig(kind="code"))
COLUMNS = {
    "entry_point",
    "reference",
    "test",
    "test_list",
    "io",
    "test_setup_code",
    "test_imports",
    "challenge_test_list",
}
MBPP_EXTRAS = ("test_setup_code", "test_imports", "challenge_test_list")  # only beside a test_list
SHAPES = ("test", "test_list", "io")


def _shape(example: dict) -> str:
    (shape,) = [s for s in SHAPES if example[s] is not None]  # exactly one
    return shape


def test_code_is_a_data_kind() -> None:
    assert "code" in CHOICES["data.kind"]


def test_file_ships_inside_the_package_with_uniform_columns() -> None:
    resource = files("grpo_cli.data") / "code_tasks.jsonl"
    lines = [line for line in resource.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == len(EXAMPLES) >= 30
    # every row has every column (null where unused): the trainer takes column names from one row
    assert all(json.loads(line).keys() == {"prompt"} | COLUMNS for line in lines)


def test_every_task_has_one_test_shape_and_the_mix_covers_all_three() -> None:
    shapes = [_shape(e) for e in EXAMPLES]
    assert shapes.count("test") >= 12 and shapes.count("test_list") >= 12 and shapes.count("io") >= 6


def _top_level_defs(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def _called_names(source: str) -> set[str]:
    tree = ast.parse(source)
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_function_prompts_are_helpers_then_a_signature_and_a_docstring_with_one_example() -> None:
    for example in EXAMPLES:
        if example["io"] is not None:
            continue
        name = example["entry_point"]
        tree = ast.parse(example["prompt"] + "    pass\n")  # the prompt ends where the body starts
        *helpers, function = tree.body  # the last top-level def is the entry point
        assert isinstance(function, ast.FunctionDef) and function.name == name
        assert all(isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom)) for n in helpers), name
        docstring = ast.get_docstring(function)
        assert docstring and docstring.count(">>> ") == 1 and example["prompt"].count(">>> ") == 1, name
        assert name in _top_level_defs(example["reference"]), name


def test_hidden_tests_differ_from_the_prompt_example() -> None:
    for example in EXAMPLES:
        prompt = example["prompt"]
        if example["io"] is not None:
            assert example["entry_point"] is None
            shown = prompt.split("Example input:\n")[1].split("Example output:\n")[0]
            assert all(case["input"] != shown for case in example["io"]), prompt[:60]
            assert all(set(case) == {"input", "output"} for case in example["io"])
            continue
        call = prompt.split(">>> ")[1].splitlines()[0]
        arguments = call[call.index("(") :]
        hidden = example["test"] or "\n".join(example["test_list"] + (example["challenge_test_list"] or []))
        assert arguments not in hidden, example["entry_point"]


def test_the_set_covers_each_public_shapes_extras() -> None:
    helper_in_check = by_name_in_check = False
    for example in EXAMPLES:
        if example["test"] is None:
            continue
        called = _called_names(example["test"])
        helpers = _top_level_defs(example["prompt"]) - {example["entry_point"]}
        helper_in_check |= bool(helpers & called)  # the check runs with the prompt's helpers in scope
        by_name_in_check |= example["entry_point"] in called  # ... and with the entry point's own name
    assert helper_in_check and by_name_in_check
    for column in MBPP_EXTRAS:
        rows = [e for e in EXAMPLES if e[column]]
        assert rows, column
        assert all(e["test_list"] is not None for e in rows), column
    assert all(isinstance(e["test_setup_code"], str) for e in EXAMPLES if e["test_setup_code"])
    assert all(isinstance(line, str) for e in EXAMPLES for line in e["test_imports"] or [])
    assert all(e["challenge_test_list"] is None or len(e["challenge_test_list"]) >= 2 for e in EXAMPLES)


def test_tasks_are_distinct() -> None:
    prompts = [e["prompt"] for e in EXAMPLES]
    names = [e["entry_point"] for e in EXAMPLES if e["entry_point"]]
    assert len(set(prompts)) == len(prompts) and len(set(names)) == len(names)


def test_loading_respects_the_usual_data_knobs() -> None:
    assert len(load_examples(DataConfig(kind="code", max_examples=5))) == 5
    assert len(load_examples(DataConfig(kind="code", fraction=0.5))) == len(EXAMPLES) // 2
    train, held_out = split_examples(EXAMPLES, 0.1, seed=0)
    assert len(held_out) == int(len(EXAMPLES) * 0.1) and len(train) + len(held_out) == len(EXAMPLES)


def _composed_data_kind(*overrides: str) -> str:
    """What `grpo train OVERRIDES --cfg job` prints as data.kind (composed here: no subprocess)."""
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides))
    return cfg.data.kind


def test_reward_code_selects_the_code_data_unless_the_command_line_names_other_data() -> None:
    register_schemas()
    assert _composed_data_kind("reward=code") == "code"
    assert _composed_data_kind("reward=code", "data=math") == "math"
    assert _composed_data_kind("data=jsonl", "reward=code") == "jsonl"
    assert _composed_data_kind() == "arithmetic"  # other rewards keep the default data
