"""Every `grpo` command the README and the site show runs, in page order, as a reader pastes them
into one directory (`tests/docs/plan.py` says how each is shrunk to seconds of work). One test per
page, so a failure names the page; all of them share one run of the plan (`tests/docs/runner.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.plan import PRINTS_ONLY, READER_FILES, Step, nav_pages, page_files, plan

PAGES = nav_pages()
WORKERS = 2  # the CI machine's cores


def run_steps(steps: list[Step], root: Path, workers: int = WORKERS) -> dict[str, dict]:
    """The steps' commands in `root`, through the runner; each result carries its log's tail."""
    os.symlink(REPO / "recipes", root / "recipes")  # --config-dir recipes, as from a clone
    os.symlink(REPO / "examples", root / "examples")
    for name, text in READER_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    for page in PAGES:
        for name, text in page_files(page).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
    logs = root / ".logs"
    logs.mkdir()
    runnable = [s for s in steps if s.why_not is None]
    spec = [
        {"id": s.id, "argv": s.argv, "cwd": str(root), "needs": s.needs, "log": str(logs / f"{i}.log")}
        for i, s in enumerate(runnable)
    ]
    (logs / "plan.json").write_text(json.dumps({"workers": workers, "steps": spec}))
    subprocess.run(
        [sys.executable, "-m", "tests.docs.runner", str(logs / "plan.json"), str(logs / "results.json")],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=True,
        timeout=900,
    )
    results = json.loads((logs / "results.json").read_text())
    for item in spec:
        log = Path(item["log"])
        results[item["id"]]["log"] = log.read_text(errors="replace")[-2500:] if log.exists() else ""
    return results


@pytest.fixture(scope="module")
def pages_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Step], dict[str, dict]]:
    steps = plan(PAGES, model_cache=None)
    return steps, run_steps(steps, tmp_path_factory.mktemp("reader"))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_command_on_the_page_runs(page: Path, pages_run: tuple[list[Step], dict[str, dict]]) -> None:
    steps, results = pages_run
    failed = [
        f"{step.id}\n{results[step.id].get('why') or results[step.id]['log']}"
        for step in steps
        if step.command.page == page and step.why_not is None and results[step.id]["rc"] != 0
    ]
    assert not failed, "\n\n".join(failed)


def test_what_cannot_run_here_is_few_and_says_why(pages_run: tuple[list[Step], dict[str, dict]]) -> None:
    """Guards the plan: a rule that skipped most commands would make the page tests vacuous."""
    steps, results = pages_run
    skipped = [s for s in steps if s.why_not and not s.why_not.startswith("the same command")]
    ran = [s for s in steps if s.why_not is None]
    # 145 commands: 99 run, 18 repeats; the rest a reader's own path, SLURM, CUDA, run by another test
    assert len(ran) >= 90 and len(skipped) <= 30, "\n".join(f"{s.id}: {s.why_not}" for s in skipped)
    # every training command runs shrunk (tests/docs/plan.py): a page's full run would cost minutes here
    trains = [s for s in ran if s.argv[0] == "train" and not PRINTS_ONLY & set(s.argv)]  # --cfg, --help: print only
    assert trains and all("debug=smoke" in s.argv or "plan=true" in s.argv for s in trains)
