"""SIGTERM, as a cluster preempts a job, on `grpo train`: the run stops on a finished step, saves
it, prints the command that resumes it and exits 143 (128 + 15); that command runs it to the end.
(A single process's Ctrl-C and SIGTERM inside the trainer: tests/training/test_interrupt.py.)

One process, and two (`distributed.num_processes=2`, gloo on the CPU): there the signal reaches
the command alone and it passes it on to the workers, or it reaches one worker alone and the two
still stop together on the same saved step. The three runs go side by side (most of each is
start-up).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, Background, read_metrics, run_grpo

STEPS = 30
ARGS = [
    "train",
    f"train.steps={STEPS}",
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "monitor.console=plain",
    "monitor.plots=false",  # not what this tests; a second each run
]
TWO = "distributed.num_processes=2"


def _workers(run_dir: Path) -> dict[int, int]:
    """{pid: RANK} of the processes (launcher and workers) still running on `run_dir`."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):  # not a process, or one that just ended
            continue
        if b"grpo_cli.commands.launch" in command and str(run_dir).encode() in command:
            rank = next((v[5:] for v in environ if v.startswith(b"RANK=")), b"-1")
            found[int(entry.name)] = int(rank)
    return found


def _preempt(run_dir: Path, *extra: str, target: Callable[[subprocess.Popen], int] = lambda p: p.pid) -> tuple:
    """`grpo train` on `run_dir`, SIGTERM to `target(process)` once two steps are written; returns
    (exit code, everything it printed, what was still running on the run directory after it exited)."""
    log = run_dir.parent / f"{run_dir.name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_cli", *ARGS, *extra, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 300
            metrics = run_dir / "metrics.jsonl"
            while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no second step in 300 s"
                time.sleep(0.02)
            os.kill(target(proc), signal.SIGTERM)
            code = proc.wait(timeout=300)
        finally:
            left = _workers(run_dir)
            for pid in [proc.pid, *left]:  # a failing test leaves nothing running
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return code, log.read_text(), left


def _rank_one(proc: subprocess.Popen, run_dir: Path) -> int:
    return next(pid for pid, rank in _workers(run_dir).items() if rank == 1)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("preemption")
    cases = {
        "one_process": lambda: _preempt(root / "one"),
        "two_processes": lambda: _preempt(root / "two", TWO),
        "one_worker": lambda: _preempt(root / "worker", TWO, target=lambda p: _rank_one(p, root / "worker")),
    }
    background = Background(request, cases)
    yield root, background
    background.close()


def _stopped_and_saved(result: tuple, run_dir: Path) -> list[str]:
    """The checks every preempted run passes; returns the resume command it printed."""
    code, output, left = result
    assert code == 143, output[-3000:]
    assert "stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]
    finished = len(read_metrics(run_dir))
    assert 2 <= finished < STEPS
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved == [f"step_{finished:06d}"]  # train.save_every=0: the stop saved its last finished step
    assert left == {}  # no worker left running (or still saving) once the command has returned
    command = shlex.split(output.split("Resume with:\n", 1)[1].splitlines()[0])
    assert command[:2] == ["grpo", "train"] and f"hydra.run.dir={run_dir}" in command
    return command


def _resume(command: list[str], run_dir: Path) -> None:
    resumed = run_grpo(*command[1:])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in (run_dir / "train.log").read_text()
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, STEPS + 1))


def test_one_process(runs) -> None:
    """The command it prints is the one it ran, on its run directory (test_two_processes runs one)."""
    root, background = runs
    command = _stopped_and_saved(background.result("one_process"), root / "one")
    assert command == ["grpo", *ARGS, f"hydra.run.dir={root / 'one'}"]


def test_two_processes(runs) -> None:
    """The signal reaches `grpo train` alone: it passes it on, and waits while the workers save."""
    root, background = runs
    command = _stopped_and_saved(background.result("two_processes"), root / "two")
    assert TWO in command
    _resume(command, root / "two")


def test_one_worker(runs) -> None:
    """Only the second worker gets SIGTERM: both stop at the end of the same step, saved."""
    root, background = runs
    _stopped_and_saved(background.result("one_worker"), root / "worker")
