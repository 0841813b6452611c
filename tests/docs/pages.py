"""Reading the docs as data: the `grpo` commands their ```bash blocks show, and the anchors their
headings get, so the tests check what a reader copies and clicks."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import markdown

from tests.conftest import REPO

DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class DocCommand:
    page: Path
    line: int  # where the command starts on its page
    argv: list[str]  # after `grpo`: the subcommand, then its arguments

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: grpo {shlex.join(self.argv)}"


def grpo_commands(page: Path) -> list[DocCommand]:
    """Each `grpo ...` line of the page's ```bash blocks (a trailing backslash continues a line;
    `# comments` dropped), in page order."""
    commands, language, pending, start = [], None, "", 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        fence = FENCE.match(line.strip())
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        if language not in ("bash", "sh", "shell"):
            continue
        if not pending:
            start = number
        pending += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if words and words[0] == "grpo" and len(words) > 1:
            commands.append(DocCommand(page, start, words[1:]))
    return commands


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc, as mkdocs.yml configures it)."""
    md = markdown.Markdown(extensions=["toc", "tables", "attr_list", "fenced_code"])
    md.convert(page.read_text(encoding="utf-8"))

    def walk(tokens: list[dict]) -> set[str]:
        return {t["id"] for t in tokens} | {i for t in tokens for i in walk(t["children"])}

    return walk(md.toc_tokens)
