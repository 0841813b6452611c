"""Ctrl-C mid-run leaves a resumable run, and resuming replays exactly what an uninterrupted run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import REPO, read_metrics, reproducible, run_grpo

ARGS = [
    "train.steps=150",
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "algo.beta=0.04",
    "train.save_every=50",
    "monitor.console=quiet",
    "monitor.plots=false",  # not what this tests; a second each run
]


def test_interrupt_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    with ThreadPoolExecutor(1) as pool:  # the uninterrupted run goes on beside the interrupted one
        straight_run = pool.submit(run_grpo, "train", *ARGS, f"hydra.run.dir={straight}")
        interrupt_and_resume(tmp_path)
        result = straight_run.result()
    assert result.returncode == 0, result.stderr[-3000:]
    assert reproducible(read_metrics(tmp_path / "resumed")) == reproducible(read_metrics(straight))


def interrupt_and_resume(tmp_path):

    resumed = tmp_path / "resumed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli", "train", *ARGS, f"hydra.run.dir={resumed}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = resumed / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.005)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr and f"hydra.run.dir={resumed}" in stderr
    interrupted_at = len(read_metrics(resumed))
    assert 5 <= interrupted_at < 150
    checkpoints = sorted(p.name for p in (resumed / "checkpoints").iterdir())
    assert f"step_{interrupted_at:06d}" in checkpoints  # the last finished step, saved on Ctrl-C
    assert not any(name.startswith(".") for name in checkpoints)  # no half-written temp dirs

    result = run_grpo("train", *ARGS, f"hydra.run.dir={resumed}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stdout + result.stderr  # logged through rich (stdout)
