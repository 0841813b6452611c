"""Shared fixtures: a saved tiny model and a way to run the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# No test contacts the model hub (nor anything off this machine): set before transformers and
# huggingface_hub read it at import, and inherited by every `grpo` subprocess a test starts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpo_cli.config.schema import TinyModelConfig  # noqa: E402
from grpo_cli.models import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests press Ctrl-C in this process and in `grpo` subprocesses. A shell without job
    control starts background commands (`bash .ci/run &`) with SIGINT ignored, and an ignored signal
    stays ignored across exec: every interrupt would vanish and those tests fail. Take the default
    back, as an interactive run has it (a subprocess then starts with Python's own handler)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + byte tokenizer saved the way a real model directory is."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TinyModelConfig(), seed=0)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """One `grpo train debug=smoke` as a user runs it (stderr a pipe), shared by the tests that only
    read what it printed and wrote. Its run directory's path is over 80 columns on its own."""
    long_name = "a_run_directory_whose_path_is_longer_than_eighty_columns_on_its_own"
    run_dir = tmp_path_factory.mktemp("smoke") / long_name / "run"
    return run_grpo("train", "debug=smoke", f"hydra.run.dir={run_dir}"), run_dir


def run_grpo(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`grpo ARGS...` as a user runs it; the environment is the caller's plus `env`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full_env.pop("HYDRA_FULL_ERROR", None)  # tests see what a user sees unless they ask
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "grpo_cli", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_once_saved(command: list[str], checkpoint: Path, env: dict[str, str], timeout: float = 240) -> None:
    """Start `command` in its own session, wait until `checkpoint` is written, then kill -9 the whole
    session (a launcher, torchrun and every worker): a preempted multi-process run."""
    import time

    proc = subprocess.Popen(
        command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout
    while not checkpoint.exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"no {checkpoint.name} in {timeout:g} s"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recorder:
    """An observer that keeps what the trainer handed to the observers, for a test to inspect."""

    def __init__(self) -> None:
        self.results: list = []

    def on_step(self, result) -> None:
        self.results.append(result)


MACHINE_DEPENDENT = ("time/", "throughput/", "memory/")  # metrics no seed can reproduce


def reproducible(rows: list[dict]) -> list[dict]:
    """Metric rows without their timings, throughput and memory: what two runs of one seed share."""
    return [{k: v for k, v in row.items() if not k.startswith(MACHINE_DEPENDENT)} for row in rows]


class Background:
    """Starts this module's slow runs together, each `grpo train` pays seconds of torch import,
    and only those whose tests were selected; each test then waits for its own result.

    A case named NAME belongs to test_NAME; a test with several runs names them NAME:WHAT."""

    def __init__(self, request: pytest.FixtureRequest, cases: dict[str, Callable[[], subprocess.CompletedProcess]]):
        selected = {
            getattr(item, "originalname", item.name)
            for item in request.session.items
            if getattr(item, "module", None) is request.module
        }
        self._cases = cases
        self._pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
        self._futures: dict[str, Future] = {
            name: self._pool.submit(run)
            for name, run in cases.items()
            if not selected or f"test_{name.split(':')[0]}" in selected
        }

    def result(self, name: str) -> subprocess.CompletedProcess:
        if name not in self._futures:
            self._futures[name] = self._pool.submit(self._cases[name])
        return self._futures[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
