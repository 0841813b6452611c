"""The tiny model is built in the run directory and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import ModelConfig
from grpo_cli.models import load_policy


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
