"""The site builds with --strict, and --strict is strict: a broken link or anchor fails the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_site_builds_strictly(tmp_path: Path) -> None:
    result = _build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


@pytest.mark.parametrize(
    "broken",
    ["[gone](no-such-page.md)", "[gone](rewards.md#no-such-heading)", "![gone](images/no-such-picture.png)"],
    ids=["page", "anchor", "image"],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, broken: str) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    page = root / "docs" / "getting-started.md"
    page.write_text(page.read_text(encoding="utf-8") + f"\n\n{broken}\n", encoding="utf-8")
    result = _build(root, tmp_path / "site")
    assert result.returncode != 0
    assert "getting-started.md" in result.stderr
