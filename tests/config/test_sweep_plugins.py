"""Hydra's sweep plugins with our configs, in-process: the shipped presets compose, the thread budget
of joblib jobs, the missing-plugin check. The runs themselves are in tests/e2e/test_sweeps.py."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grpo_cli.commands import plugins
from grpo_cli.commands.entry import register_schemas
from grpo_cli.commands.job_threads import parallel_jobs, share_cores
from grpo_cli.commands.overrides import check_overrides
from grpo_cli.commands.plugins import JOBLIB, OPTUNA, SUBMITIT, Plugin, require_plugin
from grpo_cli.config.schema import EvalConfig, TrainConfig
from grpo_cli.errors import GrpoError, MissingExtra


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    register_schemas()


def _compose(name: str, *overrides: str) -> DictConfig:
    with initialize_config_module("grpo_cli.conf", version_base=None):
        return compose(config_name=name, overrides=list(overrides), return_hydra_config=True)


def _split(cfg: DictConfig) -> tuple[DictConfig, DictConfig]:
    """(the job's config, Hydra's node), as Hydra's run_job hands the task its config: hydra deleted."""
    hydra_node = cfg.hydra
    job = copy.deepcopy(cfg)
    with read_write(job), open_dict(job):
        del job["hydra"]
    return job, hydra_node


def test_slurm_preset_composes_on_submitit() -> None:
    launcher = _compose("train", "hydra/launcher=slurm", "hydra.launcher.partition=gpu").hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.timeout_min) == (1, 1, 120)
    assert launcher.partition == "gpu"  # the command line still wins over the preset
    assert OmegaConf.to_container(launcher)["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"


def test_optuna_preset_composes_and_searches_lr_and_beta() -> None:
    cfg = _compose("train", "hydra/sweeper=optuna_lr_beta", "hydra.sweeper.n_trials=3")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert (sweeper.direction, sweeper.n_trials) == ("maximize", 3)
    assert set(sweeper.params) == {"optim.lr", "algo.beta"}
    for key in sweeper.params:  # every searched key exists in the schema
        assert OmegaConf.select(cfg, key) is not None


# ---- the thread budget of parallel jobs -----------------------------------------------------------
@pytest.mark.parametrize(
    ("n_jobs", "cores", "jobs"), [(2, 8, 2), (-1, 8, 8), (-2, 8, 7), (16, 8, 16), (-1, 1, 1), (-9, 8, 1)]
)
def test_parallel_jobs_counts_as_joblib(n_jobs: int, cores: int, jobs: int) -> None:
    assert parallel_jobs(n_jobs, cores) == jobs


@pytest.mark.parametrize(("n_jobs", "threads"), [(2, 4), (3, 2), (-1, 1), (16, 1)])
def test_joblib_jobs_share_the_cores(n_jobs: int, threads: int) -> None:
    cfg, hydra_node = _split(_compose("train", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}"))
    assert cfg.train.threads == 0
    assert share_cores(cfg, hydra_node.launcher, hydra_node.sweeper, cores=8) == threads
    run_config = OmegaConf.to_object(cfg)  # what the run function gets
    assert isinstance(run_config, TrainConfig) and run_config.train.threads == threads


def test_the_sweepers_batch_caps_the_jobs_at_once() -> None:
    """optuna hands the launcher hydra.sweeper.n_jobs trials at a time: 2 jobs on 8 cores, 4 threads."""
    cfg, hydra_node = _split(
        _compose("train", "hydra/launcher=joblib", "hydra/sweeper=optuna", "hydra.sweeper.n_jobs=2")
    )
    assert share_cores(cfg, hydra_node.launcher, hydra_node.sweeper, cores=8) == 4


def test_top_level_threads_of_eval() -> None:
    cfg, hydra_node = _split(_compose("eval", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4"))
    assert share_cores(cfg, hydra_node.launcher, cores=8) == 2
    run_config = OmegaConf.to_object(cfg)
    assert isinstance(run_config, EvalConfig) and run_config.threads == 2


@pytest.mark.parametrize(
    "overrides",
    [
        ("hydra/launcher=joblib", "train.threads=3"),  # the user's number stands
        ("train.threads=0",),  # the basic launcher runs one job at a time
        ("hydra/launcher=submitit_local",),  # a process per job, but each with its own cores
    ],
)
def test_threads_left_alone(overrides: tuple[str, ...]) -> None:
    cfg, hydra_node = _split(_compose("train", *overrides))
    before = cfg.train.threads
    assert share_cores(cfg, hydra_node.launcher, hydra_node.sweeper, cores=8) is None
    assert cfg.train.threads == before


def test_export_has_no_threads() -> None:
    cfg, hydra_node = _split(_compose("export", "hydra/launcher=joblib"))
    assert share_cores(cfg, hydra_node.launcher, cores=8) is None


# ---- the missing-plugin check --------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4", "hydra.sweeper.direction=maximize"],
        ["-m", "hydra/sweeper=optuna_lr_beta", "optim.lr=tag(log, interval(1e-4, 1e-2))"],
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "optim.lr=1e-3,3e-3"],
        ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30"],
        ["-m", "hydra/launcher=submitit_local", "hydra.launcher.cpus_per_task=2"],
    ],
)
def test_plugin_overrides_pass_when_installed(overrides: list[str]) -> None:
    check_overrides(overrides, TrainConfig)


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(plugins, "is_installed", lambda plugin: False)
    yield


@pytest.mark.parametrize(
    ("override", "plugin"),
    [
        ("hydra/sweeper=optuna", OPTUNA),
        ("hydra/sweeper=optuna_lr_beta", OPTUNA),  # our preset names the plugin in its defaults
        ("hydra/launcher=joblib", JOBLIB),
        ("hydra/launcher=slurm", SUBMITIT),
        ("hydra/launcher=submitit_slurm", SUBMITIT),
        ("hydra/launcher=basic,joblib", JOBLIB),
    ],
)
def test_missing_plugin_names_the_extra(override: str, plugin: Plugin, nothing_installed: None) -> None:
    with pytest.raises(MissingExtra) as err:
        check_overrides(["-m", override], TrainConfig)
    assert str(err.value).endswith(f'needs {plugin.title}: pip install "grpo-cli[sweep]"')
    assert err.value.exit_code == 2


def test_basic_sweeper_needs_no_plugin(nothing_installed: None) -> None:
    check_overrides(["-m", "hydra/sweeper=basic", "hydra/launcher=basic", "optim.lr=1e-3,2e-3"], TrainConfig)


def test_a_users_recipe_choosing_a_launcher_is_checked(tmp_path: Path, nothing_installed: None) -> None:
    (tmp_path / "hydra" / "launcher").mkdir(parents=True)
    (tmp_path / "hydra" / "launcher" / "mine.yaml").write_text("defaults:\n  - slurm\n  - _self_\nmem_gb: 64\n")
    (tmp_path / "recipe.yaml").write_text("defaults:\n  - train\n  - override hydra/launcher: mine\n  - _self_\n")
    with pytest.raises(MissingExtra, match="hydra/launcher=mine needs Hydra's submitit launcher"):
        check_overrides(["--config-dir", str(tmp_path), "-cn", "recipe", "-m"], TrainConfig)


def test_an_uninstalled_package_is_seen() -> None:
    assert not plugins.is_installed(Plugin("hydra_plugins.no_such_plugin", "optuna", "none"))
    assert not plugins.is_installed(Plugin("hydra_plugins.hydra_optuna_sweeper", "no_such_library_xyz", "none"))
    assert plugins.is_installed(OPTUNA)
    require_plugin("hydra/sweeper", "optuna", [])


def test_a_search_space_under_hydra_sweeper_params_is_refused_with_the_form_that_works() -> None:
    with pytest.raises(GrpoError, match=r"give the search space as the override itself, e.g. 'optim.lr=tag\(log"):
        check_overrides(
            ["-m", "hydra/sweeper=optuna", "hydra.sweeper.params.optim.lr=tag(log, interval(1e-4, 1e-2))"], TrainConfig
        )
    check_overrides(["-m", "hydra/sweeper=optuna", "hydra.sweeper.params.seed='choice(0, 1)'"], TrainConfig)
