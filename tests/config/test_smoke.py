"""`debug=smoke` turns any recipe into the tiny fp32 model: nothing of the recipe's own model and
precision is left for the checks to refuse as ignored by model=tiny or precision=fp32."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.config.schema import LoraConfig, TinyModelConfig
from grpo_cli.config.smoke import apply_smoke
from grpo_cli.config.train_checks import validate
from tests.config.test_validate import valid_config


def test_a_real_model_recipe_in_smoke_mode_validates(tmp_path: Path) -> None:
    cfg = valid_config(
        **{
            "model.kind": "hf",
            "model.path": str(tmp_path),
            "model.trust_remote_code": True,
            "model.cache_dir": str(tmp_path / "cache"),
            "model.lora": LoraConfig(enabled=True, r=4),
            "precision.dtype": "fp16",
            "precision.autocast": True,
            "precision.grad_scaler": True,
            "optim.lr": 1e-5,
        }
    )
    apply_smoke(cfg)
    assert [w.split("=")[0] for w in validate(cfg)] == ["rollout.num_generations"]  # smoke's 2, and no refusal
    assert cfg.model.kind == "tiny" and cfg.model.path is None and cfg.precision.dtype == "fp32"
    assert cfg.model.lora == LoraConfig(enabled=True, r=4)  # the recipe's LoRA is what it smoke-tests


def test_a_tiny_recipe_keeps_its_size() -> None:
    cfg = valid_config(**{"model.tiny": TinyModelConfig(hidden_size=128, num_layers=3)})
    apply_smoke(cfg)
    assert cfg.model.tiny == TinyModelConfig(hidden_size=128, num_layers=3)


def test_a_fixed_length_run_validates_in_smoke_mode() -> None:
    """benchmarks.md's `rollout.min_new_tokens=16`: smoke's 8 new tokens must not leave a minimum above them."""
    cfg = valid_config(**{"rollout.max_new_tokens": 16, "rollout.min_new_tokens": 16})
    apply_smoke(cfg)
    validate(cfg)
    assert cfg.rollout.min_new_tokens == cfg.rollout.max_new_tokens == 8
