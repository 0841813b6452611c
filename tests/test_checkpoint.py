"""grpo_cli/checkpoint.py: a checkpoint write that runs out of room fails as the OSError it is (the
command's one line for a full disk), and leaves nothing that looks like a checkpoint."""

from __future__ import annotations

import errno
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.checkpoint import latest_checkpoint, save_checkpoint, write_errors_as_os_errors
from grpo_cli.config.schema import TinyModelConfig
from grpo_cli.models import build_tiny_model, load_tokenizer


@contextmanager
def files_at_most(size: int) -> Iterator[None]:
    """No file of this process may grow past `size` bytes (ulimit -f): a write past it fails with
    EFBIG, as one on a full disk fails with ENOSPC, through the same library paths."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel's signal ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, dict]:
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(), seed=0)
    model = AutoModelForCausalLM.from_pretrained(directory)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()  # its two moments: a training_state.pt larger than the weights
    return model, load_tokenizer(directory), {"optimizer": optimizer.state_dict()}


def test_the_weights_file_running_out_of_room_is_an_os_error_naming_the_checkpoint(tmp_path: Path, policy) -> None:
    model, tokenizer, _ = policy
    target = tmp_path / "checkpoints" / "step_000001"
    with pytest.raises(OSError) as failed, files_at_most(4096):  # safetensors' SafetensorError underneath
        save_checkpoint(target, model, tokenizer, {"step": 1}, {})
    assert failed.value.errno == errno.EFBIG and failed.value.filename == str(target)
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no half-written directory left


def test_the_training_state_running_out_of_room_is_an_os_error_naming_the_checkpoint(tmp_path: Path, policy) -> None:
    model, tokenizer, state = policy
    whole = save_checkpoint(tmp_path / "whole", model, tokenizer, {"step": 1}, state)
    largest_but_state = max(p.stat().st_size for p in whole.iterdir() if p.name != "training_state.pt")
    assert (whole / "training_state.pt").stat().st_size > largest_but_state + 4096
    target = tmp_path / "checkpoints" / "step_000001"
    with pytest.raises(OSError) as failed, files_at_most(largest_but_state + 4096):  # torch.save's enforce fail
        save_checkpoint(target, model, tokenizer, {"step": 1}, state)
    assert failed.value.errno == errno.EFBIG and failed.value.filename == str(target)
    assert latest_checkpoint(tmp_path) is None and list((tmp_path / "checkpoints").iterdir()) == []


def test_a_bug_raised_while_an_os_error_was_handled_is_not_passed_off_as_the_disks(tmp_path: Path) -> None:
    """Only torch's writer wraps the OSError it met: any other error stays what it is, so a library's
    bug never reads as a full disk."""
    target = tmp_path / "checkpoints" / "step_000001"
    with pytest.raises(KeyError), write_errors_as_os_errors(target):
        try:
            raise FileNotFoundError(errno.ENOENT, "No such file", "cache.json")
        except FileNotFoundError:
            raise KeyError("tokenizer_class") from None
