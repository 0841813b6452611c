"""Hydra for every subcommand, built from the table: the schemas in the ConfigStore and the one
`@hydra.main` of the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from grpo_cli.commands import SUBCOMMANDS, Subcommand
from grpo_cli.commands.errors import cannot_write_errors, report_user_errors
from grpo_cli.commands.job_threads import share_cores
from grpo_cli.commands.run_lock import run_dir_lock


def register_schemas() -> None:
    """Each subcommand's schema in Hydra's ConfigStore as NAME_schema: the base conf/NAME.yaml
    composes onto (its first `defaults:` entry)."""
    for sub in SUBCOMMANDS:
        if sub.schema is not None:  # plain argparse commands compose no config
            ConfigStore.instance().store(name=sub.schema_name, node=sub.schema)


def hydra_entry_point(sub: Subcommand) -> Callable[[], float]:
    """Compose conf/NAME.yaml onto its schema and call the run function with the config object
    and Hydra's output directory; returns the run's objective for sweepers."""
    register_schemas()

    @hydra.main(version_base=None, config_path="pkg://grpo_cli.conf", config_name=sub.name)
    def task(cfg: DictConfig) -> float:
        run = sub.load()  # here, not above: `--help` and `--cfg job` never import torch
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if hydra_cfg.mode == RunMode.MULTIRUN:  # parallel jobs (hydra/launcher=joblib) share the cores
            share_cores(cfg, hydra_cfg.launcher, hydra_cfg.sweeper)

        def locked_run() -> float:
            if not sub.locks_run_dir:  # score, export: a read-only output is one line too
                with cannot_write_errors(run_dir, checkpoints=False):
                    return run(OmegaConf.to_object(cfg), run_dir)
            # a second run in this directory fails at the lock, naming the first one's pid
            with run_dir_lock(run_dir), cannot_write_errors(run_dir, checkpoints=sub.name == "train"):
                return run(OmegaConf.to_object(cfg), run_dir)

        return report_user_errors(locked_run)

    return task
