"""Every schema key has a line under conf/ with a trailing `# comment` (its meaning, unit, range),
and `grpo train --help` shows every key.

YAML loaders drop comments, so the files are read line by line here: the key path comes from the
indentation, `- key:` opens a list element (written `name[]` in the path).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from grpo_cli.config.keys import leaf_keys
from grpo_cli.config.schema import (
    CheckConfig,
    EvalConfig,
    ExportConfig,
    RolloutRunConfig,
    ScoreConfig,
    TrainConfig,
)
from tests.conftest import REPO, run_grpo

CONF = REPO / "conf"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- +)?(?P<key>[A-Za-z_]\w*):(?P<rest>(\s.*)?)$")
PRIMARY = {
    TrainConfig: "train",
    ScoreConfig: "score",
    RolloutRunConfig: "rollout",
    EvalConfig: "eval",
    ExportConfig: "export",
    CheckConfig: "check",
}


def _has_comment(rest: str) -> bool:
    """A `#` outside quotes, after whitespace, with words after it."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return bool(rest[i + 1 :].strip())
    return False


def documented_keys(text: str, prefix: str = "") -> set[str]:
    """Dotted keys (list elements as `name[]`) of the lines of `text` that carry a comment.

    A list empty by default can show its element only in a commented-out example, so a comment
    line holding `key: value  # comment` documents a key under a list (`curriculum.phases[].until`).
    """
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings and list elements
    keys = set()
    for raw in text.splitlines():
        example = raw.lstrip().startswith("#")
        match = KEY_LINE.match(raw.replace("#", " ", 1) if example else raw)
        if not match:
            continue
        opened = list(stack)
        indent = len(match["indent"])
        if match["dash"]:
            opened = [(i, k) for i, k in opened if i < indent] + [(indent, "[]")]
            indent += len(match["dash"])
        opened = [(i, k) for i, k in opened if i < indent]
        key = prefix + ".".join(k for _, k in opened + [(indent, match["key"])]).replace(".[]", "[]")
        documented = _has_comment(match["rest"])
        if example and not (documented and "[]" in key):
            continue  # prose in a comment, not an example line
        stack = opened + [(indent, match["key"])]
        if documented:
            keys.add(key)
    return keys


def _group_files() -> list[tuple[str, Path]]:
    return [
        (p.parent.relative_to(CONF).as_posix(), p)
        for p in sorted(CONF.rglob("*.yaml"))
        if p.parent != CONF and p.relative_to(CONF).parts[0] != "hydra"
    ]


def conf_documented(primary: str) -> set[str]:
    """What conf/PRIMARY.yaml and every group option file document, as schema keys."""
    keys = {k for k in documented_keys((CONF / f"{primary}.yaml").read_text()) if k.split(".")[0] != "hydra"}
    for group, path in _group_files():
        text = path.read_text()
        if "# @package" not in text:  # such a file lands elsewhere than `group.`
            keys |= documented_keys(text, group.replace("/", ".") + ".")
    return keys


@pytest.mark.parametrize("schema", list(PRIMARY), ids=lambda s: s.__name__)
def test_every_schema_key_has_a_commented_line_in_conf(schema: type) -> None:
    documented = conf_documented(PRIMARY[schema])
    missing = [key for key in leaf_keys(schema) if key not in documented]
    assert not missing, f"keys of {schema.__name__} without a commented line under conf/: {missing}"


def test_documented_keys_reads_nesting_lists_and_examples() -> None:
    text = (
        "# grpo train\n"
        "functions:                # the list\n"
        '  - name: a               # first, "#" in a comment\n'
        "    kwargs:\n"
        "      x: 1                # nested mapping\n"
        "    weight: 1.0\n"
        "  - target: b             # second element\n"
        "# Columns: prose, not a key # even with a hash\n"
        "phases: []                # empty by default; e.g.\n"
        "#  - until: 0.2           # an example element\n"
        'sep: "a # b"\n'
        "top: 1                    # back at the top\n"
    )
    assert documented_keys(text, "reward.") == {
        "reward.functions",
        "reward.functions[].name",
        "reward.functions[].kwargs.x",
        "reward.functions[].target",
        "reward.phases",
        "reward.phases[].until",
        "reward.top",
    }


def test_removing_a_line_from_conf_is_noticed() -> None:
    text = (CONF / "train.yaml").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("resume_allow_changes:"))
    assert "train.resume_allow_changes" in documented_keys(text)
    assert "train.resume_allow_changes" not in documented_keys(text.replace(line + "\n", ""))
    uncommented = line.split("#")[0].rstrip()
    assert "train.resume_allow_changes" not in documented_keys(text.replace(line, uncommented))


HELP_CASES = [
    ("train", TrainConfig, ["on_long_prompt: truncate_left", "resume_allow_changes: false", "normalize:"]),
    ("score", ScoreConfig, ["on_long_prompt: truncate_left", "batch_size: 64", "normalize:"]),
    ("rollout", RolloutRunConfig, ["num_generations: 8", "resume: false", "split: all"]),
    ("eval", EvalConfig, ["success_threshold: 1.0", "split: eval", "compare: null"]),
    ("export", ExportConfig, ["checkpoint: null", "dtype: auto", "merge_lora: true"]),
    ("check", CheckConfig, ["seed: 0", "kind: tiny"]),
]


@pytest.fixture(scope="module")
def help_runs() -> Iterator[dict[str, Future]]:
    """Every subcommand's --help, two processes at a time: each pays seconds of start-up."""
    with ThreadPoolExecutor(2) as pool:
        yield {name: pool.submit(run_grpo, name, "--help", timeout=300) for name, _, _ in HELP_CASES}


@pytest.mark.parametrize(("subcommand", "schema", "keys"), HELP_CASES)
def test_help_shows_every_section_and_the_new_keys(
    subcommand: str, schema: type, keys: list[str], help_runs: dict[str, Future]
) -> None:
    result = help_runs[subcommand].result()
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    sections = {key.split(".")[0].split("[")[0] for key in leaf_keys(schema)}
    for section in sorted(sections):
        assert any(line.startswith(f"{section}:") for line in lines), f"{section} missing from --help"
    for key in keys:
        assert key in result.stdout, f"{key} missing from grpo {subcommand} --help"
