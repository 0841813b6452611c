"""Data-parallel training with the engine: each process builds its own engine (in a child
process) on its own share of the cores, and every process's pushes reach its engine."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import read_metrics, run_grpo
from tests.vllm.test_engine import FLOOR


def test_two_processes_each_sample_from_their_own_engine_on_their_own_cores(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_grpo(
        "train", "distributed.num_processes=2", "model.tiny.num_heads=2", "rollout.backend=vllm",
        "rollout.vllm.dtype=fp32", "train.steps=3", "train.prompts_per_step=4", "rollout.num_generations=4",
        "monitor.plots=false", "monitor.console=plain", f"hydra.run.dir={run_dir}",
        env={"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:  # summed over both processes' tokens: one stale engine would lift it past 0.1
        assert 0 < row["rollout/engine_gap"] < FLOOR, row["step"]
    assert "VLLM_CPU_OMP_THREADS_BIND='0'" in output and "VLLM_CPU_OMP_THREADS_BIND='1'" in output  # a core each
