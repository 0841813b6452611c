"""The Hydra entry point of a subcommand, built from its record: the one `@hydra.main` of the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from grpo_cli.commands import Subcommand
from grpo_cli.commands.errors import report_user_errors
from grpo_cli.config.store import register_schemas


def hydra_entry_point(sub: Subcommand) -> Callable[[], float]:
    """Compose conf/NAME.yaml onto its schema and call the run function with the config object
    and Hydra's output directory; returns the run's objective for sweepers."""
    register_schemas()
    run = sub.load()

    @hydra.main(version_base=None, config_path="pkg://grpo_cli.conf", config_name=sub.name)
    def task(cfg: DictConfig) -> float:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        return report_user_errors(lambda: run(OmegaConf.to_object(cfg), run_dir))

    return task
