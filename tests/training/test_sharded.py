"""distributed.strategy=fsdp end to end, through the real `grpo` command: 2 processes train what 2
ddp processes train (10 free-running steps), hold half the training state each, resume bit for bit
after a kill -9, resume on 1 process, and export a directory plain transformers loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.conftest import REPO, kill_once_saved, read_metrics, reproducible, run_grpo

QUICK = ("monitor.console=plain", "monitor.plots=false", "train.prompts_per_step=4", "rollout.num_generations=4")
ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
STATE = re.compile(r"training state per process \(distributed.strategy=(\w+), (\d) process\(es\)\): .*; ([\d.]+) MiB")


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    proc = run_grpo("train", *QUICK, f"hydra.run.dir={run_dir}", *overrides, env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def state_mib(run_dir: Path) -> tuple[str, float]:
    (match,) = STATE.findall((run_dir / "train.log").read_text())[:1]
    return match[0], float(match[2])


@pytest.fixture(scope="module")
def ddp_and_fsdp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sharded")
    runs = {strategy: root / strategy for strategy in ("ddp", "fsdp")}
    for strategy, run_dir in runs.items():
        train(run_dir, "train.steps=10", "distributed.num_processes=2", f"distributed.strategy={strategy}")
    return runs


def test_fsdp_trains_what_ddp_trains_step_for_step(ddp_and_fsdp: dict[str, Path]) -> None:
    """The same draws (sampling is seeded by step and rank), so every logged figure agrees."""
    ddp, fsdp = (reproducible(read_metrics(ddp_and_fsdp[s])) for s in ("ddp", "fsdp"))
    assert [row["step"] for row in fsdp] == list(range(1, 11))
    for a, b in zip(ddp, fsdp):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {a['step']}: {key}"
            else:
                assert b[key] == value, f"step {a['step']}: {key}"
    assert fsdp[-1]["reward/mean"] != fsdp[0]["reward/mean"]  # it learned something


def test_each_fsdp_process_holds_half_the_training_state(ddp_and_fsdp: dict[str, Path]) -> None:
    ddp_strategy, ddp_mib = state_mib(ddp_and_fsdp["ddp"])
    fsdp_strategy, fsdp_mib = state_mib(ddp_and_fsdp["fsdp"])
    assert (ddp_strategy, fsdp_strategy) == ("ddp", "fsdp")
    assert fsdp_mib == pytest.approx(ddp_mib / 2, rel=0.02)  # parameters + gradients + AdamW's moments


def test_a_killed_fsdp_run_resumes_bit_for_bit_then_on_one_process_and_exports(
    ddp_and_fsdp: dict[str, Path], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", *QUICK, "train.steps=10", "train.save_every=2", f"hydra.run.dir={run_dir}"]
    args += ["distributed.num_processes=2", "distributed.strategy=fsdp"]
    kill_once_saved(  # launcher, torchrun and both workers
        [sys.executable, "-m", "grpo_cli", *args],
        run_dir / "checkpoints" / "step_000004",
        {**os.environ, **ENV, "PYTHONUNBUFFERED": "1"},
    )
    assert not (run_dir / "summary.json").exists()

    resumed = run_grpo(*args, env=ENV)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in (run_dir / "train.log").read_text()
    straight = reproducible(read_metrics(ddp_and_fsdp["fsdp"]))
    again = reproducible(read_metrics(run_dir))
    assert [row["step"] for row in again] == list(range(1, 11))
    assert again == straight  # bit for bit: the resumed steps too

    single = run_grpo(
        *[a for a in args if not a.startswith(("distributed.", "train.steps"))], "train.steps=11", env=ENV
    )
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    assert "written by 2 process(es), this run has 1" in (run_dir / "train.log").read_text()
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, 12))

    checkpoint = run_dir / "checkpoints" / "step_000010"
    exported = tmp_path / "exported"
    proc = run_grpo("export", f"checkpoint={checkpoint}", f"output={exported}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(exported)
    saved = load_file(str(checkpoint / "model.safetensors"))
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name  # whole tensors, not shards
    assert json.loads((checkpoint / "trainer_state.json").read_text())["processes"] == 2


def test_two_nodes_of_one_process_each_train_what_one_node_of_two_does(
    ddp_and_fsdp: dict[str, Path], tmp_path: Path
) -> None:
    """Two `torchrun --nnodes 2` launches on this machine, rendezvous on 127.0.0.1, as a user starts
    one per node: the same run as one node's 2 processes (ranks, seeds and shards are the same)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run_dir = tmp_path / "run"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "grpo_cli",
                "train",
                *QUICK,
                "train.steps=3",
                "distributed.strategy=fsdp",
                f"hydra.run.dir={run_dir}",
            ],
            cwd=REPO,
            env={**os.environ, **ENV, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    for node in nodes:
        output = node.communicate(timeout=300)[0].decode()
        assert node.returncode == 0, output[-3000:]
    two_nodes = reproducible(read_metrics(run_dir))
    one_node = reproducible(read_metrics(ddp_and_fsdp["fsdp"]))[:3]
    assert two_nodes == one_node
    assert json.loads((run_dir / "summary.json").read_text())["processes"] == 2


def test_under_bf16_autocast_fsdp_computes_in_bf16_and_reduces_in_fp32(tmp_path: Path) -> None:
    """precision=bf16 becomes FSDP2's mixed-precision policy (bf16 blocks from fp32 master shards,
    fp32 gradient reduction): the run tracks ddp under the same autocast to bf16's rounding."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        runs[strategy] = tmp_path / strategy
        train(runs[strategy], "train.steps=3", "precision=bf16", "algo.beta=0.04", "distributed.num_processes=2",
              f"distributed.strategy={strategy}")  # fmt: skip
    ddp, fsdp = read_metrics(runs["ddp"]), read_metrics(runs["fsdp"])
    for a, b in zip(ddp, fsdp):
        assert b["reward/mean"] == a["reward/mean"]  # the same draws from nearly the same weights
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2)
        assert b["kl"] == pytest.approx(a["kl"], rel=5e-2, abs=1e-6)
