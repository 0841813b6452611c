"""Every algorithm preset (conf/algo/*.yaml, found on disk) composes as `grpo train algo=NAME`
does, holds the values that define its method, cites its source, and trains two steps of the tiny
model (issue 23: each preset composes and trains two steps in CI)."""

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

# What makes each preset the method it names (and the paper its header must cite).
DEFINING = {
    "grpo": ("arXiv:2402.03300", {"loss_type": "grpo", "scale_rewards": "group", "ratio_level": "token"}),
    "dapo": (
        "arXiv:2503.14476",
        {
            "loss_type": "dapo",
            "epsilon_low": 0.2,
            "epsilon_high": 0.28,  # clip-higher
            "beta": 0.0,
            "mask_truncated": True,  # overlong filtering
            "dynamic_sampling.enabled": True,
        },
    ),
    "dr_grpo": ("arXiv:2503.20783", {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    "gspo": (
        "arXiv:2507.18071",
        {"ratio_level": "sequence", "epsilon_low": 0.0003, "epsilon_high": 0.0004, "loss_type": "grpo"},
    ),
    "cispo": ("arXiv:2506.13585", {"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.0}),
    "sapo": (
        "arXiv:2511.20347",
        {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
    ),
    "luspo": (
        "arXiv:2602.05261",
        {"loss_type": "luspo", "ratio_level": "sequence", "epsilon_low": 0.002, "epsilon_high": 0.0025},
    ),
    "trl_defaults": (
        "TRL 1.16",
        {
            "loss_type": "dapo",
            "kl_ratio_correction": True,
            "rollout_correction.mode": "sequence_mask",
            "rollout_correction.cap": 3.0,
        },
    ),
    "vespo": (
        "arXiv:2602.10693",
        {
            "loss_type": "vespo",
            "ratio_level": "token",
            "vespo.k_pos": 2.0,
            "vespo.lambda_pos": 3.0,
            "vespo.k_neg": 3.0,
            "vespo.lambda_neg": 2.0,
        },
    ),
}


def composed(preset: str) -> TrainConfig:
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=[f"algo={preset}"]))
    assert isinstance(cfg, TrainConfig)
    return cfg


def test_every_preset_on_disk_is_described_here() -> None:
    assert sorted(DEFINING) == PRESETS


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_holds_the_values_that_define_its_method(preset: str) -> None:
    source, values = DEFINING[preset]
    cfg = composed(preset)
    for key, value in values.items():
        got = cfg.algo
        for part in key.split("."):
            got = getattr(got, part)
        assert got == value, f"algo={preset}: algo.{key}"
    lines = (REPO / "conf" / "algo" / f"{preset}.yaml").read_text().splitlines()
    header = " ".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))])
    assert source in header, f"conf/algo/{preset}.yaml should cite {source} in its header comment"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_algo_preset_trains_two_steps(preset: str, tmp_path: Path) -> None:
    cfg = composed(preset)
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 2, 4, 4
    cfg.data.num_examples = 50
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    rows = [trainer.step().metrics for _ in range(2)]
    trainer.cleanup()
    for metrics in rows:
        assert metrics["optimizer_steps"] == cfg.algo.num_iterations * cfg.algo.mini_batches
        assert metrics["skipped_updates"] == 0 and math.isfinite(metrics["loss"])
        assert math.isfinite(metrics["grad_norm"])
