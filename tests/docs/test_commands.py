"""Every `grpo` command the README and the site show is one that runs: its keys and values pass the
same checks as a typed command line, and the getting-started page's chain runs end to end."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from grpo_cli.commands import BY_NAME
from grpo_cli.commands.overrides import check_overrides
from grpo_cli.commands.trl_config import expand_trl_config
from tests.conftest import REPO, run_grpo
from tests.docs.pages import DOCS, DocCommand, grpo_commands

PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
COMMANDS = [command for page in PAGES for command in grpo_commands(page)]
GETTING_STARTED = grpo_commands(DOCS / "getting-started.md")


def test_the_pages_show_commands() -> None:
    """Guards the parser: a fence style it missed would make every check below vacuous."""
    assert len(COMMANDS) >= 40
    assert len(GETTING_STARTED) >= 4
    assert any(command.argv == ["train"] for command in GETTING_STARTED), "getting started shows `grpo train`"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_keys_and_values_are_valid(command: DocCommand, monkeypatch: pytest.MonkeyPatch) -> None:
    name, args = command.argv[0], command.argv[1:]
    if name in ("--help", "-h", "--version"):  # grpo's own, before any subcommand
        return
    assert name in BY_NAME, f"{command}: no subcommand {name!r}"
    schema = BY_NAME[name].schema
    if schema is None or "--keys" in args:  # grpo plot (argparse), the reference printout
        return
    monkeypatch.chdir(REPO)  # --config-dir recipes is relative to the repository
    checkable = [arg for arg in args if "$" not in arg]  # a shell variable's value is the page's to show
    if name == "train":  # trl_config=FILE becomes overrides before the checks, as `grpo train` does
        checkable = expand_trl_config(checkable, io.StringIO())
    check_overrides(checkable, schema)


def _smoke(argv: list[str], run_dir: Path) -> list[str]:
    """A getting-started line as the test runs it: shrunk to a few prompts, runs kept apart."""
    if {"--cfg", "--help", "--keys"} & set(argv):  # prints, runs nothing; and nothing may follow --cfg's value
        return argv
    if {"--cfg", "--help", "--keys"} & set(argv):  # prints, runs nothing; and nothing may follow --cfg's value
        return argv
    extra = []
    if argv[0] == "train" and "debug=smoke" not in argv:
        extra.append("debug=smoke")
    if argv[0] in ("rollout", "eval") and not any(a.startswith("max_prompts=") for a in argv):
        extra.append("max_prompts=8")  # what debug=smoke is to train: the command's shape, in seconds
    if argv[0] in ("train", "rollout", "eval") and not any(a.startswith("hydra.run.dir=") for a in argv):
        extra.append(f"hydra.run.dir={run_dir}")
    return [*argv, *extra]


WRITE_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=", "output=")


def _writes(argv: list[str]) -> set[str]:
    """The paths a command writes that a later one may read."""
    return {arg.split("=", 1)[1] for arg in argv if arg.startswith(WRITE_KEYS)}


def _reads(argv: list[str], written: str) -> bool:
    values = [arg.split("=", 1)[-1] for arg in argv if not arg.startswith(WRITE_KEYS)]
    return any(value == written or value.startswith(written + "/") for value in values)


def test_getting_started_runs_in_page_order(tmp_path: Path) -> None:
    """The page's commands in a fresh directory, as a reader pastes them: each after the earlier
    ones whose output it reads (two at a time where none does, which the page's order allows)."""
    os.symlink(REPO / "recipes", tmp_path / "recipes")
    done: list[tuple[DocCommand, list[str], set[str], Future]] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for i, command in enumerate(GETTING_STARTED):
            argv = _smoke(command.argv, tmp_path / f"unnamed_{i}")
            needs = [future for _, _, writes, future in done if any(_reads(argv, w) for w in writes)]

            def run(argv: list[str] = argv, needs: list[Future] = needs) -> subprocess.CompletedProcess:
                for need in needs:
                    need.result()
                return run_grpo(*argv, cwd=tmp_path)

            done.append((command, argv, _writes(argv), pool.submit(run)))
        for command, argv, _, future in done:
            result = future.result()
            assert result.returncode == 0, f"{command}\nran as: grpo {shlex.join(argv)}\n{result.stderr[-2000:]}"
