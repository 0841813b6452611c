"""The README is the front door: short, with the two commands, and every link landing on a page and heading."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.docs.pages import anchors

README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 && pip install -e . && grpo train" in text
    assert 'pip install -e ".[test]"' in text and "python -m pytest" in text


def test_readme_links_land() -> None:
    broken = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        page = (REPO / path) if path else README
        if not page.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and page.suffix == ".md" and anchor not in anchors(page):
            broken.append(f"{target}: {path} has no heading #{anchor}")
    assert not broken, broken


def test_adding_a_reward_is_one_click_from_the_readme() -> None:
    """The question a new user asks first after the default run, answered from the front page."""
    text = README.read_text(encoding="utf-8")
    assert "docs/rewards.md#writing-your-own-reward" in text
    assert "writing-your-own-reward" in anchors(REPO / "docs" / "rewards.md")
