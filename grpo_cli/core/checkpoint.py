"""Atomic checkpoints: a crash mid-write never leaves a directory that looks complete."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

COMPLETE_MARKER = "trainer_state.json"  # written last; a checkpoint without it is ignored


def save_checkpoint(
    directory: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> Path:
    """Write to a sibling temp dir, then rename it into place (atomic on one filesystem)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if optimizer is not None:
            torch.save(
                {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "torch_rng": torch.get_rng_state(),
                    "python_rng": random.getstate(),
                },
                tmp / "training_state.pt",
            )
        (tmp / COMPLETE_MARKER).write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
