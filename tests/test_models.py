"""The tiny model is built in the run directory and nowhere else; model.disable_dropout makes the
policy in train mode the function the rollouts sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import LoraConfig, ModelConfig, TinyModelConfig
from grpo_cli.models import build_tiny_model, load_policy


def test_the_tiny_model_is_written_into_the_run_directory_whatever_model_path_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to be written to model.path: `./HuggingFaceTB/SmolLM2-135M-Instruct` then held a random
    model that a later `model=hf model.path=HuggingFaceTB/SmolLM2-135M-Instruct` trained as SmolLM2."""
    monkeypatch.chdir(tmp_path)
    cfg = ModelConfig(kind="tiny", path="HuggingFaceTB/SmolLM2-135M-Instruct")  # a library caller; validate refuses it
    _, _, model_dir = load_policy(cfg, tmp_path / "run", 0, torch.device("cpu"), "fp32")
    assert model_dir == tmp_path / "run" / "tiny_model" and (model_dir / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def twice_in_train_mode(cfg: ModelConfig, run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-probs of one sequence, two forwards in a row, in the mode it trains in."""
    model, tokenizer, _ = load_policy(cfg, run_dir, 0, torch.device("cpu"), "fp32")
    assert model.training
    if cfg.lora.enabled:  # B starts at 0, where the adapters' dropout has nothing to thin
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_()
    batch = tokenizer(["12+7=19"], return_tensors="pt")
    with torch.no_grad():
        return tuple(model(**batch).logits.log_softmax(-1) for _ in range(2))


@pytest.mark.parametrize("disable", [True, False], ids=["disable_dropout", "keep_dropout"])
def test_a_model_with_attention_dropout_scores_alike_twice_when_dropout_is_disabled(
    tmp_path: Path, disable: bool
) -> None:
    """Llama's attention dropout is a rate the layer hands the kernel in train mode, no dropout module."""
    directory = build_tiny_model(tmp_path / "with_dropout", TinyModelConfig(), seed=0)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    cfg = ModelConfig(kind="hf", path=str(directory), disable_dropout=disable)
    first, second = twice_in_train_mode(cfg, tmp_path / "run")
    assert torch.equal(first, second) is disable


@pytest.mark.parametrize("disable", [True, False], ids=["disable_dropout", "keep_dropout"])
def test_lora_adapters_dropout_is_disabled_too(tmp_path: Path, disable: bool) -> None:
    lora = LoraConfig(enabled=True, r=4, dropout=0.5, target_modules=["q_proj", "v_proj"])
    first, second = twice_in_train_mode(ModelConfig(lora=lora, disable_dropout=disable), tmp_path)
    assert torch.equal(first, second) is disable
