"""Atomic checkpoints, and finding the one to resume from.

A checkpoint is written to a temporary sibling and renamed into place; `trainer_state.json` is
written last, so a directory without it is never taken for a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.errors import GrpoError

COMPLETE_MARKER = "trainer_state.json"
TRAINING_STATE = "training_state.pt"  # optimizer, scheduler, RNG: what from_pretrained does not hold
BASE_MODEL_KEY = "base_model"  # in trainer_state.json: the starting model's directory (a LoRA adapter's base)


def save_checkpoint(
    directory: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    training_state: dict[str, Any] | None = None,
) -> Path:
    """Write to a sibling temp dir, then rename it into place (atomic on one filesystem)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if training_state is not None:
            torch.save(training_state, tmp / TRAINING_STATE)
        (tmp / COMPLETE_MARKER).write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def is_complete(directory: Path) -> bool:
    return (directory / COMPLETE_MARKER).is_file() and (directory / TRAINING_STATE).is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/step_N` of a run; half-written temp dirs are skipped."""
    candidates = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.is_dir() and is_complete(p)]
    return max(candidates, key=lambda p: int(p.name.split("_")[1]), default=None)


def resume_point(setting: str, run_dir: Path) -> Path | None:
    """train.resume: `auto` (the run directory's newest checkpoint, if any), `never`, or a path."""
    if setting == "never":
        return None
    if setting == "auto":
        return latest_checkpoint(run_dir)
    path = Path(setting)
    if not is_complete(path):
        raise GrpoError(
            f"train.resume={setting}: not a complete checkpoint (needs {COMPLETE_MARKER} and {TRAINING_STATE})"
        )
    return path


def read_trainer_state(directory: Path) -> dict[str, Any]:
    """The JSON half (step, config): cheap, so a resume can check the config before loading models."""
    return json.loads((Path(directory) / COMPLETE_MARKER).read_text())


def load_checkpoint_state(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state, training_state) of a checkpoint we wrote ourselves."""
    trainer_state = read_trainer_state(directory)
    # weights_only=False: the file holds Python RNG state, written by this code, not downloaded
    training_state = torch.load(directory / TRAINING_STATE, weights_only=False)
    return trainer_state, training_state


def run_dir_of(checkpoint: Path) -> Path | None:
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def base_model_dir(checkpoint: Path, state: dict[str, Any]) -> Path:
    """The LoRA adapter's base: the path recorded at save time; for a run directory moved since,
    its tiny model beside the checkpoints or model.path."""
    model = state["config"]["model"]
    run_dir = run_dir_of(checkpoint)
    candidates = [state.get(BASE_MODEL_KEY), model["path"]]  # old checkpoints lack the recorded path
    if model["kind"] == "tiny" and run_dir is not None:
        candidates.append(str(run_dir / "tiny_model"))
    for candidate in candidates:
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    tried = ", ".join(str(c) for c in candidates if c)
    raise GrpoError(f"{checkpoint} holds a LoRA adapter, but its base model is not found (tried {tried})")
