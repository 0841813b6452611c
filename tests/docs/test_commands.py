"""Every `grpo` command the README and the site show passes the same checks as a typed command line:
its keys and values, in a second, for every command (tests/docs/test_pages_run.py then runs them)."""

from __future__ import annotations

import io

import pytest

from grpo_cli.commands import BY_NAME
from grpo_cli.commands.overrides import check_overrides
from grpo_cli.commands.trl_config import expand_trl_config
from tests.conftest import REPO
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
