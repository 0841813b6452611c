"""Every algorithm preset (conf/algo/*.yaml, found on disk) trains a step of the tiny model as
`grpo train algo=NAME` composes it (issue 21 item 12: no test trained algo=dapo)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from grpo_cli.commands.entry import register_schemas
from grpo_cli.config.schema import TrainConfig
from grpo_cli.training import GRPOTrainer
from tests.conftest import REPO

PRESETS = sorted(path.stem for path in (REPO / "conf" / "algo").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_algo_preset_trains_a_step(preset: str, tmp_path: Path) -> None:
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        composed = compose(config_name="train", overrides=[f"algo={preset}"])
    cfg = OmegaConf.to_object(composed)
    assert isinstance(cfg, TrainConfig)
    preset_values = OmegaConf.load(REPO / "conf" / "algo" / f"{preset}.yaml")
    assert cfg.algo.loss_type == preset_values.loss_type and cfg.algo.ratio_level == preset_values.ratio_level
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, 4, 4
    cfg.data.num_examples = 50
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    metrics = trainer.step().metrics
    trainer.cleanup()
    assert metrics["optimizer_steps"] == cfg.algo.num_iterations * cfg.algo.mini_batches
    assert metrics["skipped_updates"] == 0 and math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
