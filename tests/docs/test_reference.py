"""docs/reference.md is the schema, read: every key, its type, default and comment, kept in step by CI."""

from __future__ import annotations

import dataclasses
import io

import pytest

from grpo_cli.config.keys import leaf_keys
from grpo_cli.config.reference import COMMANDS, key_docs, main, print_keys, render
from grpo_cli.config.schema import TrainConfig
from tests.conftest import REPO, run_grpo

PAGE = REPO / "docs" / "reference.md"


def test_the_checked_in_page_is_the_schemas() -> None:
    """Fails when a key is added, renamed, re-defaulted or re-commented without regenerating the page."""
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/reference.md is stale: python -m grpo_cli.config.reference --write docs/reference.md"
    )


@pytest.mark.parametrize("command,schema", COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_key_of_every_command_is_listed_with_a_comment(command: str, schema: type) -> None:
    rows = key_docs(schema())
    listed = {row.key for row in rows}
    assert set(leaf_keys(schema)) <= listed, f"grpo {command}: keys missing from the reference"
    undocumented = [row.key for row in rows if not row.comment]
    assert not undocumented, f"grpo {command}: give these fields a comment in schema.py: {undocumented}"
    text = render()
    missing = [key for key in leaf_keys(schema) if f"| `{key}` |" not in text]
    assert not missing, f"grpo {command}: not on the page: {missing}"


def test_rows_carry_the_schemas_defaults_and_comments() -> None:
    rows = {row.key: row for row in key_docs(TrainConfig())}
    assert (rows["train.steps"].type, rows["train.steps"].default) == ("int", "300")
    assert rows["algo.adaptive_clip.alpha"].default == "0.4"
    assert rows["model.path"].type == "str | None" and rows["model.path"].default == "null"
    assert rows["eval.k"].default == "[1, 5]"
    assert rows["reward.functions"].default == "[exact_match, partial_credit]"
    assert rows["reward.functions[].name"].default == "???"
    # a comment block above the field, several lines long, joined
    assert rows["guard.reward_cv_threshold"].comment.startswith("batch raw reward std / |mean| above this")
    assert "paused at step 10" in rows["guard.reward_cv_threshold"].comment
    # the schema's tuple of allowed values spelled out where a comment names it
    assert rows["algo.loss_type"].comment.startswith("grpo | bnpo | dr_grpo | dapo | cispo | sapo | luspo | vespo:")


def test_a_changed_default_makes_the_page_differ() -> None:
    """The check compares values, not just key names: a default changed in the schema shows."""
    config = TrainConfig()
    config.algo = dataclasses.replace(config.algo, beta=0.04)
    rows = {row.key: row for row in key_docs(config)}
    assert rows["algo.beta"].default == "0.04"


def test_check_mode_fails_on_a_stale_page(tmp_path, capsys) -> None:
    stale = tmp_path / "reference.md"
    stale.write_text(render().replace("| `train.steps` | `int` | `300` |", "| `train.steps` | `int` | `200` |"))
    assert main(["--check", str(stale)]) == 1
    assert "--write" in capsys.readouterr().err
    assert main(["--write", str(stale)]) == 0 and main(["--check", str(stale)]) == 0


def test_keys_prints_one_prefix() -> None:
    out = io.StringIO()
    assert print_keys(TrainConfig, "algo.adaptive_clip", out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["algo.adaptive_clip.enabled", "bool", "=", "false"]
    assert sum(line.startswith("algo.adaptive_clip.") for line in lines) == 6
    assert print_keys(TrainConfig, "algo.nope", io.StringIO()) == 2


def test_grpo_keys_on_the_command_line() -> None:
    """`grpo SUBCOMMAND --keys PREFIX`, before Hydra or torch: the page's rows for one command."""
    result = run_grpo("eval", "--keys", "max_prompts")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:4] == ["max_prompts", "int", "=", "0"]
    unknown = run_grpo("train", "--keys", "algo.nope")
    assert unknown.returncode == 2 and "algo.nope" in unknown.stderr
