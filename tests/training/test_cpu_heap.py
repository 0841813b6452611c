"""train.cpu_heap: with `auto` a CPU trainer keeps freed memory in the process, so a step's large
tensors reuse freed pages instead of fresh mappings faulted in page by page; `system` leaves glibc
as it is. Process-wide, so each case runs a trainer in a process of its own and reads glibc's own
counters (mallinfo2) around a 64 MiB tensor allocated after the trainer's first step."""

from __future__ import annotations

import ctypes
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from tests.training.test_trainer import small_config

GLIBC = platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")

SCRIPT = r"""
import ctypes, json, sys
from pathlib import Path
import torch
from grpo_cli.training import GRPOTrainer
from tests.training.test_trainer import small_config

class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
trainer = GRPOTrainer(small_config(steps=1, cpu_heap=sys.argv[1]), Path(sys.argv[2]))
trainer.setup()
trainer.step()
before = libc.mallinfo2()
tensor = torch.ones(16 * 2**20)  # 64 MiB, past glibc's largest mmap threshold
held = libc.mallinfo2()
del tensor
freed = libc.mallinfo2()
from grpo_cli.cpu_heap import resident_bytes, trim_kept_memory
trim_kept_memory()  # what the second step calls: the resident size settles
settled = resident_bytes()
tensor = torch.ones(settled // 4)  # as much again, written, then freed: kept, past the bound
del tensor
kept = resident_bytes()
trimmed = trim_kept_memory()
print(json.dumps({
    "words": trainer.diagnostics.get("cpu_heap"),
    "mapped_for_it": held.hblkhd - before.hblkhd,
    "kept_after_free": freed.fordblks - held.fordblks,
    "grown_by": (kept - settled) / settled,
    "trimmed": trimmed,
    "given_back": (kept - resident_bytes()) / settled,
}))
"""


def heap_after_a_step(setting: str, run_dir: Path) -> dict:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, setting, str(run_dir)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="train.cpu_heap changes glibc's malloc; this is not glibc (or has no mallinfo2)")
def test_auto_keeps_a_freed_large_tensor_in_the_heap_and_says_so(tmp_path: Path) -> None:
    seen = heap_after_a_step("auto", tmp_path)
    assert seen["words"].startswith("kept in the process for reuse (train.cpu_heap=auto")
    assert seen["mapped_for_it"] < 2**20  # served from the heap, not a mapping of its own
    assert seen["kept_after_free"] >= 64 * 2**20  # and still there for the next step's tensors
    # what it keeps is bounded: the settled size again, freed, is given back after the step
    assert seen["grown_by"] > 0.5 and seen["trimmed"] and seen["given_back"] > 0.5


@pytest.mark.skipif(not GLIBC, reason="train.cpu_heap changes glibc's malloc; this is not glibc (or has no mallinfo2)")
def test_system_leaves_glibc_mapping_and_unmapping_large_tensors(tmp_path: Path) -> None:
    seen = heap_after_a_step("system", tmp_path)
    assert seen["words"] == "the system allocator's defaults (train.cpu_heap=system)"
    assert seen["mapped_for_it"] >= 64 * 2**20  # glibc's default: a fresh mapping, faulted in page by page
    assert seen["kept_after_free"] < 2**20  # and unmapped when freed
    assert seen["grown_by"] < 0.1 and not seen["trimmed"]  # nothing kept, nothing to give back


def test_an_unknown_heap_setting_is_refused_by_name() -> None:
    with pytest.raises(GrpoError, match=r"train\.cpu_heap='jemalloc'.*auto, system"):
        validate(small_config(cpu_heap="jemalloc"))


def test_a_run_on_an_accelerator_leaves_the_heap_and_says_nothing() -> None:
    import torch

    from grpo_cli.cpu_heap import keep_freed_memory

    # its large tensors live on the device; the host's allocator is not the one a step waits on
    assert keep_freed_memory("auto", torch.device("meta")) is None


SWEEP_SCRIPT = r"""
import ctypes, json
import torch
from grpo_cli.cpu_heap import keep_freed_memory

class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
cpu = torch.device("cpu")
words = [keep_freed_memory(setting, cpu) for setting in ("auto", "system")]  # a sweep's two jobs
before = libc.mallinfo2()
tensor = torch.ones(16 * 2**20)  # 64 MiB, past glibc's largest mmap threshold
held = libc.mallinfo2()
again = keep_freed_memory("auto", cpu)  # a third job: auto takes effect again
print(json.dumps({"words": words + [again], "mapped_for_it": held.hblkhd - before.hblkhd}))
"""


@pytest.mark.skipif(not GLIBC, reason="train.cpu_heap changes glibc's malloc; this is not glibc (or has no mallinfo2)")
def test_system_after_an_auto_job_in_the_same_process_gives_glibc_its_mapping_back() -> None:
    """A sweep runs its jobs in one process: `system` after `auto` must not leave glibc changed
    while its start-up line says the system's defaults."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SWEEP_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    auto, system, again = seen["words"]
    assert auto.startswith("kept in the process for reuse") and again == auto
    assert "restored" in system and "train.cpu_heap=system" in system
    assert seen["mapped_for_it"] >= 64 * 2**20  # a fresh mapping again, as glibc's default does
