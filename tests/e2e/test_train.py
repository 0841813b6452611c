"""`grpo train` end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tests.conftest import Background, read_metrics, reproducible, run_grpo

REQUIRED_METRICS = {
    "step",
    "reward/mean",
    "reward/std",
    "kl",
    "loss",
    "clip_frac",
    "completion_len/mean",
    "frac_zero_std_groups",
    "lr",
    "time/generate_s",
    "time/train_s",
    "entropy",
    "diversity/distinct2_group",
    "diversity/distinct2_batch",
    "diversity/frac_identical_groups",
    "repetition/rate",
    "throughput/tokens_per_s",
    "throughput/completions_per_s",
    "memory/peak_mib",
    "reward/exact_match/nan_indices",
}


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[Background, Path]]:
    """The module's four `grpo train` runs, started together: each pays seconds of torch import, and
    a tiny model trains on one thread, leaving the other core idle."""
    root = tmp_path_factory.mktemp("train")
    same_seed = ["train.steps=3", "train.prompts_per_step=4", "rollout.num_generations=4", "algo.beta=0.04"]
    same_seed.append("monitor.plots=false")  # not what this tests
    cases = {
        "default_run_learns": lambda: run_grpo("train", f"hydra.run.dir={root / 'default'}"),
        "two_step_hf_model_with_kl_and_reuse_writes_every_output": lambda: run_grpo(
            "train",
            "model=hf",
            f"model.path={tiny_model_dir}",
            "algo.beta=0.04",
            "algo.num_iterations=2",
            "algo.loss_type=dapo",
            "train.steps=2",
            "train.prompts_per_step=4",
            "rollout.num_generations=4",
            "monitor.log_completions_every=1",
            "train.grad_accum_steps=2",
            "train.threads=1",  # as the tiny model gets by itself: a model=hf run would take every core
            f"hydra.run.dir={root / 'two_step'}",
        ),
        # two processes of one seed, each under whatever load the others make: the same numbers
        **{
            f"same_seed_same_run:{name}": (
                lambda name=name: run_grpo("train", *same_seed, f"hydra.run.dir={root / 'same_seed' / name}")
            )
            for name in "ab"
        },
    }
    background = Background(request, cases)
    yield background, root
    background.close()


@pytest.mark.slow
def test_default_run_learns(runs: tuple[Background, Path]) -> None:
    """`grpo train` with no arguments: the reward of the last 10 steps clearly beats the first 10.
    Its stderr is a pipe, as in CI: plain lines, no progress bar; and it draws its pictures."""
    background, root = runs
    result, run_dir = background.result("default_run_learns"), root / "default"
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300
    assert summary["reward_last10"] > 3 * summary["reward_first10"]
    assert summary["reward_last10"] - summary["reward_first10"] > 0.15
    metrics = read_metrics(run_dir)
    assert len(metrics) == 300
    # exact answers appear: not only the dense partial credit moved
    assert sum(m["reward/exact_match/mean"] for m in metrics[-20:]) > 0
    assert "grpo train: summary" in result.stderr
    assert "\x1b[" not in result.stderr  # no cursor movement or colour in a log
    assert "reward hacking" not in result.stderr  # partial credit is shaping that works: exact_match rises too
    step_lines = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines] == ["1/300", *(f"{n}/300" for n in range(10, 301, 10))]
    for picture in ("curves.png", "nan_heatmap.png"):
        assert (run_dir / picture).stat().st_size > 10_000


def test_two_step_hf_model_with_kl_and_reuse_writes_every_output(runs: tuple[Background, Path]) -> None:
    """beta>0 (reference model), num_iterations=2 (stored old log-probs), dapo, model=hf."""
    background, root = runs
    result, run_dir = background.result("two_step_hf_model_with_kl_and_reuse_writes_every_output"), root / "two_step"
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "train.log"):
        assert (run_dir / name).is_file(), name
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for row in metrics:
        assert REQUIRED_METRICS <= row.keys()
        assert isinstance(row["kl"], float) and row["kl"] >= 0
    # the second pass over a rollout sees a moved policy: the KL term is live
    assert metrics[1]["kl"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"steps", "wall_s", "reward_first10", "reward_last10"} <= summary.keys()
    assert summary["steps"] == 2
    checkpoint = run_dir / "checkpoints" / "step_000002"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.config.vocab_size > 0
    assert (checkpoint / "trainer_state.json").is_file()
    completions = (run_dir / "completions" / "step_000001.jsonl").read_text().splitlines()
    assert {"prompt", "completion", "reward", "advantage"} <= json.loads(completions[0]).keys()
    assert "algo:\n  loss_type: dapo" in (run_dir / "config.yaml").read_text()


def test_same_seed_same_run(runs: tuple[Background, Path]) -> None:
    """Seeded and repeatable on CPU: two runs with one seed log the same numbers."""
    background, root = runs
    logged = []
    for name in "ab":
        result = background.result(f"same_seed_same_run:{name}")
        assert result.returncode == 0, result.stderr[-3000:]
        logged.append(reproducible(read_metrics(root / "same_seed" / name)))
    assert logged[0] == logged[1]
    assert logged[0][0]["reward/mean"] is not None
