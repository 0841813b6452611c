"""Two runs in one run directory: the second fails at once, naming the first one's pid, and writes
nothing there; a directory Hydra only knows after composing is locked by the task."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_cli.commands.run_lock import LOCK_FILE, lock_run_dir, unlock_run_dir
from grpo_cli.errors import GrpoError
from tests.conftest import REPO, Background, read_metrics, run_grpo


@pytest.fixture(scope="module", autouse=True)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    """The second test's run, started with the module (autouse): it overlaps the first test's runs,
    each paying seconds of torch import."""
    run_dir = tmp_path_factory.mktemp("known_after_composing") / "run"

    def while_this_process_holds_the_lock() -> subprocess.CompletedProcess:
        assert lock_run_dir(run_dir)  # this test process holds it, as a running grpo would
        try:
            return run_grpo(
                "train",
                "debug=smoke",
                "hydra.run.dir=${oc.env:GRPO_TEST_RUN_DIR}",
                env={"GRPO_TEST_RUN_DIR": str(run_dir)},
            )
        finally:
            unlock_run_dir(run_dir)

    background = Background(
        request, {"a_run_directory_known_only_after_composing_is_locked_by_the_task": while_this_process_holds_the_lock}
    )
    yield background, run_dir
    background.close()


def test_a_second_train_in_a_running_runs_directory_fails_at_once_naming_its_pid(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli", "train", "debug=smoke", "debug.steps=20", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 120
    while not (run_dir / LOCK_FILE).exists() or not (run_dir / LOCK_FILE).read_text().strip():
        assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
        time.sleep(0.05)
    started = time.monotonic()
    second = run_grpo("train", "debug=smoke", "train.seed=1", f"hydra.run.dir={run_dir}")
    refused_in = time.monotonic() - started
    still_running = first.poll() is None  # the two did overlap: else this test proved nothing
    _, first_err = first.communicate(timeout=600)
    assert still_running, "the first run ended before the second one started"
    assert second.returncode == 1
    assert f"is in use by another grpo run (pid {first.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
    assert refused_in < 30  # at once: before any model loads
    assert first.returncode == 0, first_err[-2000:]
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, 21))  # the first run's lines only
    assert "train.seed=1" not in (run_dir / ".hydra" / "overrides.yaml").read_text()  # its record stands


def test_a_run_directory_known_only_after_composing_is_locked_by_the_task(runs: tuple[Background, Path]) -> None:
    background, run_dir = runs
    result = background.result("a_run_directory_known_only_after_composing_is_locked_by_the_task")
    assert result.returncode == 1
    assert f"is in use by another grpo run (pid {os.getpid()}" in result.stderr
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize("value", ["", "''"])
def test_an_empty_run_directory_is_refused_before_anything_is_written(tmp_path: Path, value: str) -> None:
    """`hydra.run.dir=` would run in the current directory: the user's own config.yaml and train.log
    there would be overwritten and appended to."""
    (tmp_path / "config.yaml").write_text("mine: 1\n")
    (tmp_path / "train.log").write_text("my log\n")
    done = run_grpo("train", "debug=smoke", f"hydra.run.dir={value}", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: hydra.run.dir is empty: it would run in the current directory and overwrite its files; "
        "name a directory for the run"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "train.log"]
    assert (tmp_path / "config.yaml").read_text() == "mine: 1\n" and (tmp_path / "train.log").read_text() == "my log\n"


def test_an_empty_sweep_directory_is_refused_too(tmp_path: Path) -> None:
    done = run_grpo("train", "-m", "debug=smoke", "train.seed=0,1", "hydra.sweep.dir=", cwd=tmp_path)
    assert done.returncode == 1 and "error: hydra.sweep.dir is empty" in done.stderr, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_file_given_as_the_run_directory_is_named_as_a_file(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("notes\n")
    with pytest.raises(GrpoError) as refused:
        lock_run_dir(readme)
    assert str(refused.value) == f"hydra.run.dir={readme} is a file, not a directory: name a directory for the run"
    assert readme.read_text() == "notes\n"


def test_a_run_directory_that_cannot_be_created_says_where_and_why() -> None:
    with pytest.raises(GrpoError) as refused:
        lock_run_dir(Path("/proc/x"))
    assert str(refused.value) == (
        "hydra.run.dir=/proc/x: cannot create the directory: /proc takes no new directories; "
        "name a writable place for the run"
    )


def test_a_sweep_directory_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    done = run_grpo("train", "-m", "debug=smoke", "train.seed=0,1", "hydra.sweep.dir=/proc/x", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: hydra.sweep.dir=/proc/x: cannot create the directory: /proc takes no new directories; "
        "name a writable place for the run"
    ]
