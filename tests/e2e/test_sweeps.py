"""Multirun sweeps on Hydra's own plugins, run as a user runs them: jobs in parallel processes
(hydra/launcher=joblib), an optuna search returning sweep.objective, and the error a user without
the `sweep` extra sees. Each job is a few steps of the tiny model on the CPU."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import joblib
import pytest
import yaml

from tests.conftest import Background, read_metrics, run_grpo

SHORT_JOB = [
    "train.steps=6",
    "train.prompts_per_step=4",
    "monitor.plots=false",
    "monitor.console=plain",
]
OBJECTIVE = "last10/partial_credit"  # not the default: the job must return what sweep.objective names


def _hide_optuna_sweeper(root: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes `hydra_plugins.hydra_optuna_sweeper` fail to
    import, for grpo's check and for Hydra's plugin scan alike: as if the extra were not installed."""
    package = root / "hydra_plugins" / "hydra_optuna_sweeper"  # hydra_plugins is a namespace package
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("hidden by the test: the sweep extra is not installed")\n')
    return root


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    root = tmp_path_factory.mktemp("sweeps")
    hidden = _hide_optuna_sweeper(root / "no_optuna")
    cases = {
        "joblib_grid": lambda: run_grpo(
            "train",
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "optim.lr=1e-3,3e-3",
            "algo.beta=0,0.04",
            *SHORT_JOB,
            f"hydra.sweep.dir={root / 'joblib'}",
            timeout=300,
        ),
        "optuna_search": lambda: run_grpo(
            "train",
            "-m",
            "hydra/sweeper=optuna",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=1",
            "hydra.sweeper.direction=maximize",
            "hydra.sweeper.sampler.seed=0",
            "optim.lr=tag(log, interval(1e-4, 1e-2))",
            f"sweep.objective={OBJECTIVE}",
            *SHORT_JOB,
            f"hydra.sweep.dir={root / 'optuna'}",
            timeout=300,
        ),
        "missing_plugin": lambda: run_grpo(
            "train",
            "-m",
            "hydra/sweeper=optuna",
            "hydra.sweeper.n_trials=4",
            "optim.lr=tag(log, interval(1e-4, 1e-2))",
            f"hydra.sweep.dir={root / 'never'}",
            env={"PYTHONPATH": str(hidden)},
        ),
        "hydra_without_plugin": lambda: run_grpo("train", "--info", "plugins", env={"PYTHONPATH": str(hidden)}),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def _summary_rows(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "sweep_summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_joblib_grid(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("joblib_grid")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = root / "joblib"
    rows = _summary_rows(sweep)
    assert len(rows) == 4
    assert {
        tuple(sorted(a for a in row["overrides"].split() if a.startswith(("optim.lr", "algo.beta")))) for row in rows
    } == {
        ("algo.beta=0", "optim.lr=0.001"),
        ("algo.beta=0", "optim.lr=0.003"),
        ("algo.beta=0.04", "optim.lr=0.001"),
        ("algo.beta=0.04", "optim.lr=0.003"),
    }
    assert all(row["steps"] == "6" and row["objective"] == row["reward_last10"] != "" for row in rows)
    jobs = [sweep / row["job"] for row in rows]
    # four different runs: the learning rate moves the reward, beta the loss (a KL term or none)
    outcomes = {(row["reward_last10"], read_metrics(job)[-1]["loss"]) for row, job in zip(rows, jobs)}
    assert len(outcomes) == 4, outcomes
    threads = max(1, joblib.cpu_count() // 2)  # n_jobs=2: half the cores each; 1 on a 2-core machine
    for job in jobs:
        # train.threads=0 (auto) became the job's share of the cores, in the config the run got
        assert yaml.safe_load((job / "config.yaml").read_text())["train"]["threads"] == threads
        log = (job / "train.log").read_text()
        assert f"torch threads: {threads} (train.threads=0 under the joblib launcher: 2 jobs at once" in log
        # the job ran under the joblib launcher (its worker processes), as Hydra recorded it
        launcher = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]["launcher"]
        assert launcher["_target_"].endswith("JoblibLauncher") and launcher["n_jobs"] == 2


def test_optuna_search(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("optuna_search")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = root / "optuna"
    rows = _summary_rows(sweep)
    assert len(rows) == 4  # one row per trial, jobs 0..3 as with the basic sweeper
    assert [row["job"] for row in rows] == ["0", "1", "2", "3"]
    lrs = set()
    for row in rows:
        lr = next(a for a in row["overrides"].split() if a.startswith("optim.lr="))
        assert 1e-4 <= float(lr.split("=")[1]) <= 1e-2
        lrs.add(lr)
        assert row["objective"] == row[OBJECTIVE] != ""  # sweep.objective's figure, not reward_last10
        summary = json.loads((sweep / row["job"] / "summary.json").read_text())
        assert float(row["objective"]) == summary[OBJECTIVE]
    assert len(lrs) == 4  # optuna sampled four learning rates
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["name"] == "optuna"
    # what optuna maximised is what each job returned: sweep.objective from its summary.json
    assert results["best_value"] == pytest.approx(max(float(row["objective"]) for row in rows))
    assert set(results["best_params"]) == {"optim.lr"}
    assert f"objective {OBJECTIVE}" in result.stderr


def test_missing_plugin(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("missing_plugin")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ['error: hydra/sweeper=optuna needs Hydra\'s optuna sweeper: pip install "grpo-cli[sweep]"']
    assert "Traceback" not in result.stdout + result.stderr
    assert not (root / "never").exists()
    # the same environment hides the plugin from Hydra's own scan: the case a user without the extra is in
    plugins = background.result("hydra_without_plugin")
    assert plugins.returncode == 0, plugins.stderr[-3000:]
    assert "BasicSweeper" in plugins.stdout and "OptunaSweeper" not in plugins.stdout
