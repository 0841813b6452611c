"""The `grpo` command as a user runs it: dispatch, Hydra's options after the subcommand, sweeps."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, Background, read_metrics, run_grpo

CONF = REPO / "conf"
TINY_RUN = [
    "train.steps=1",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=4",
    "train.threads=1",  # a tiny model trains faster on one thread, and these runs overlap
]


def _write_user_config_dir(root: Path) -> Path:
    """A primary config extending the packaged `train`, plus a group option of the user's own."""
    config_dir = root / "my_configs"
    (config_dir / "reward").mkdir(parents=True)
    (config_dir / "my_run.yaml").write_text(
        "defaults:\n"
        "  - train\n"
        "  - _self_\n"
        "train:\n  steps: 1\n  prompts_per_step: 2\n  threads: 1\n"
        "rollout:\n  num_generations: 2\n  max_new_tokens: 4\n"
        "optim:\n  lr: 0.0025\n"
    )
    (config_dir / "reward" / "only_exact.yaml").write_text(
        "functions:\n  - name: my_exact\n    target: exact_match\n    weight: 2.0\n"
    )
    return config_dir


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    root = tmp_path_factory.mktemp("cli")
    config_dir = _write_user_config_dir(root)
    cases = {  # the longest first: a pool of two
        "multirun": lambda: run_grpo(
            "train", "-m", "optim.lr=1e-3,2e-3", *TINY_RUN, f"hydra.sweep.dir={root / 'sweep'}", timeout=300
        ),
        "config_dir_primary_config": lambda: run_grpo(
            "train",
            "--config-dir",
            str(config_dir),
            "-cn",
            "my_run",
            "reward=only_exact",
            f"hydra.run.dir={root / 'user_run'}",
            timeout=300,
        ),
        "train_help": lambda: run_grpo("train", "--help", f"hydra.run.dir={root / 'help_run'}"),
        "cfg_job": lambda: run_grpo(
            "train", "--cfg", "job", "optim.lr=0.5", "algo=dapo", f"hydra.run.dir={root / 'cfg_run'}"
        ),
        # the dispatcher's own runs (no Hydra, no torch) last: the pool starts the longest first
        "top_level_help_lists_subcommands": lambda: run_grpo("--help"),
        "no_subcommand_prints_usage_and_fails": lambda: run_grpo(),
        "unknown_subcommand_suggests_the_nearest": lambda: run_grpo("trian", "optim.lr=1"),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for path in sorted(CONF.rglob("*.yaml")):
        rel = path.relative_to(CONF)
        if len(rel.parts) >= 2 and rel.parts[0] != "hydra":
            groups.setdefault(rel.parent.as_posix(), []).append(rel.stem)
    return {group: sorted(options) for group, options in groups.items()}


# ---- the dispatcher (fast: no torch import) -------------------------------------------------------
def test_top_level_help_lists_subcommands(runs: tuple[Background, Path]) -> None:
    result = runs[0].result("top_level_help_lists_subcommands")
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout
    assert "usage" in result.stdout.lower()


def test_no_subcommand_prints_usage_and_fails(runs: tuple[Background, Path]) -> None:
    result = runs[0].result("no_subcommand_prints_usage_and_fails")
    assert result.returncode != 0
    assert "train" in result.stdout + result.stderr


def test_unknown_subcommand_suggests_the_nearest(runs: tuple[Background, Path]) -> None:
    result = runs[0].result("unknown_subcommand_suggests_the_nearest")
    assert result.returncode != 0
    assert "trian" in result.stderr
    assert "did you mean train" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# ---- Hydra after the subcommand -------------------------------------------------------------------
def test_train_help(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("train_help")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "algo: cispo, dapo, dr_grpo, grpo, gspo, luspo, sapo, trl_defaults, vespo" in out
    assert "model: hf, smollm2_135m, tiny" in out
    for group, options in _groups().items():
        assert f"{group}: {', '.join(options)}" in out, f"group {group} missing from --help"
    assert "optim:" in out and "lr:" in out  # the composed config is shown too
    assert not (root / "help_run").exists()


def test_cfg_job(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("cfg_job")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optim:" in result.stdout and "lr:" in result.stdout
    assert "lr: 0.5" in result.stdout
    cfg = OmegaConf.create(result.stdout)  # the printed config is plain YAML
    assert cfg.optim.lr == 0.5
    assert cfg.algo.loss_type == "dapo" and cfg.algo.epsilon_high == 0.28
    assert set(cfg) >= {"model", "data", "reward", "algo", "rollout", "optim", "train"}
    assert "hydra" not in cfg
    assert not (root / "cfg_run").exists(), "--cfg job must not run anything"


def test_multirun(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("multirun")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = root / "sweep"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "config.yaml").exists())
    assert len(jobs) == 2, list(sweep.iterdir())
    lrs = set()
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["steps"] == 1
        assert len(read_metrics(job)) == 1
        lrs.add(OmegaConf.load(job / "config.yaml").optim.lr)
    assert lrs == {1e-3, 2e-3}
    # one table and one CSV list every job's overrides and final figures
    with (sweep / "sweep_summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["overrides"].split()[0] for row in rows] == ["optim.lr=0.001", "optim.lr=0.002"]
    assert all(row["steps"] == "1" and row["reward_last10"] for row in rows)
    assert "sweep: 2 jobs" in result.stderr


def test_config_dir_primary_config(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("config_dir_primary_config")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = root / "user_run"
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.train.steps == 1 and saved.optim.lr == 0.0025  # from the user's primary config
    assert saved.algo.loss_type == "grpo"  # the packaged train defaults underneath
    assert [fn.name for fn in saved.reward.functions] == ["my_exact"]  # the user's group option
    assert saved.reward.functions[0].weight == 2.0
    assert len(read_metrics(run_dir)) == 1
    assert (run_dir / "summary.json").is_file()
