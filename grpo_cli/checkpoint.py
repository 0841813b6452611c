"""Atomic checkpoints, and finding the one to resume from.

A checkpoint is written to a temporary sibling and renamed into place; `trainer_state.json` is
written last, so a directory without it is never taken for a complete checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
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
        with write_errors_as_os_errors(directory):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if training_state is not None:
                with open(tmp / TRAINING_STATE, "wb") as file:  # a file object: a failed write keeps its OSError
                    torch.save(training_state, file)
            (tmp / COMPLETE_MARKER).write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


@contextlib.contextmanager
def write_errors_as_os_errors(target: Path) -> Iterator[None]:
    """A full disk reaches us inside a library's error: torch.save's `[enforce fail at
    inline_container.cc]` RuntimeError (the OSError as its context), safetensors' SafetensorError
    (`os error 28` in its text). Raised as the OSError it is, naming `target` (not the temporary
    directory, removed), so the command's one line for a full disk, a quota or a read-only directory
    says it."""
    try:
        yield
    except Exception as err:
        # only torch's writer wraps the OSError: any other error raised while one was being handled
        # is a bug of its own, never passed off as a disk's
        wrapped = isinstance(err, RuntimeError) and "inline_container" in str(err)
        cause = err if isinstance(err, OSError) else err.__context__ if wrapped else None
        if isinstance(cause, OSError) and cause.errno:  # the temporary directory's file is gone: name the target
            raise OSError(cause.errno, cause.strerror, str(target)) from err
        code = re.search(r"\(os error (\d+)\)", str(err))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(target)) from err


def is_complete(directory: Path) -> bool:
    return (directory / COMPLETE_MARKER).is_file() and (directory / TRAINING_STATE).is_file()


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """A run's complete `checkpoints/step_N`, newest first; half-written temp dirs are skipped."""
    candidates = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.is_dir() and is_complete(p)]
    return sorted(candidates, key=lambda p: int(p.name.split("_")[1]), reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/step_N` of a run."""
    return next(iter(complete_checkpoints(run_dir)), None)


def unreadable(directory: Path) -> str | None:
    """Why a complete-looking checkpoint cannot be resumed (a copy cut short, a garbled file), or
    None. Cheap: the JSON is parsed, and the zip archive torch.save writes must end in its directory."""
    marker, state = Path(directory) / COMPLETE_MARKER, Path(directory) / TRAINING_STATE
    try:
        if not isinstance(json.loads(marker.read_text()).get("step"), int):
            return f"{marker} cannot be read (it has no step)"
    except (OSError, ValueError, AttributeError) as err:
        return f"{marker} cannot be read ({type(err).__name__}: {err})"
    try:
        with zipfile.ZipFile(state):
            pass
    except (OSError, zipfile.BadZipFile) as err:
        return f"{state} cannot be read ({err}: cut short?)"
    return next(filter(None, (safetensors_cut_short(f) for f in sorted(Path(directory).glob("*.safetensors")))), None)


def safetensors_cut_short(path: Path) -> str | None:
    """Why a .safetensors file is not whole, or None: its header (8 bytes of length, then JSON) gives
    where its last tensor ends, which must be the file's size. Reads the header only."""
    try:
        with open(path, "rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(size))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        if path.stat().st_size != 8 + size + end:
            return f"{path} cannot be read ({path.stat().st_size} bytes, its header says {8 + size + end}: cut short?)"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"{path} cannot be read ({type(err).__name__}: {err})"
    return None


def resume_point(setting: str, run_dir: Path) -> tuple[Path | None, list[str]]:
    """train.resume: `auto` (the run directory's newest readable checkpoint, if any, with why each
    newer one was passed over), `never`, or a path (refused when unreadable)."""
    if setting == "never":
        return None, []
    if setting == "auto":
        passed_over = []
        for checkpoint in complete_checkpoints(run_dir):
            reason = unreadable(checkpoint)
            if reason is None:
                return checkpoint, passed_over
            passed_over.append(reason)
        if passed_over:
            raise GrpoError(
                f"no checkpoint of {run_dir} can be read ({'; '.join(passed_over)}); start over with "
                "train.resume=never (the old run is kept aside) or another hydra.run.dir"
            )
        return None, []
    path = Path(setting)
    if not is_complete(path):
        raise GrpoError(
            f"train.resume={setting}: not a complete checkpoint (needs {COMPLETE_MARKER} and {TRAINING_STATE})"
        )
    reason = unreadable(path)
    if reason is not None:
        raise GrpoError(f"train.resume={setting}: {reason}")
    return path, []


# what a fresh start must not mix with: its checkpoints, metric lines, completions, TensorBoard events
EARLIER_RUN = ("checkpoints", "metrics.jsonl", "completions", "tb")


def set_aside_earlier_run(run_dir: Path) -> Path:
    """Move an earlier run's checkpoints, metric lines and completions into `RUN/replaced_N/`: a fresh
    start in its directory then has nothing of it to resume from or append to, and nothing is
    deleted (renames on one filesystem: no copy)."""
    number = 1
    while os.path.lexists(Path(run_dir) / f"replaced_{number}"):  # a dangling link is taken too
        number += 1
    aside = Path(run_dir) / f"replaced_{number}"
    aside.mkdir()
    for name in EARLIER_RUN:
        if (Path(run_dir) / name).exists():
            os.replace(Path(run_dir) / name, aside / name)
    return aside


def read_trainer_state(directory: Path) -> dict[str, Any]:
    """The JSON half (step, config): cheap, so a resume can check the config before loading models."""
    return json.loads((Path(directory) / COMPLETE_MARKER).read_text())


def load_checkpoint_state(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state, training_state) of a checkpoint we wrote ourselves."""
    trainer_state = read_trainer_state(directory)
    # weights_only=False: the file holds Python RNG state, written by this code, not downloaded
    try:
        training_state = torch.load(directory / TRAINING_STATE, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:  # garbled past what `unreadable` checks
        raise GrpoError(
            f"{Path(directory) / TRAINING_STATE} cannot be read ({str(err).splitlines()[0]}): resume from an "
            "earlier checkpoint (train.resume=PATH) or start over (train.resume=never)"
        ) from None
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
