"""One run at a time in a run directory.

Two `grpo train` in one `hydra.run.dir` would both exit 0 and leave one run's metrics beside the
other's checkpoints. The first run holds an flock on `run.lock` (the file names its pid); a second
one fails at once naming that pid. The kernel drops an flock when its process ends, kill -9
included, so a dead run never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpo_cli.errors import GrpoError

LOCK_FILE = "run.lock"
_held: dict[Path, int] = {}  # resolved run directory -> the lock file's descriptor, in this process


def lock_run_dir(run_dir: Path) -> bool:
    """Take `run_dir`'s lock for this process, for as long as it runs or until `unlock_run_dir`.
    False when this process holds it already (the dispatcher locks an explicit hydra.run.dir before
    Hydra writes into it; the task locks the directory Hydra resolved)."""
    key = Path(run_dir).resolve()
    if key in _held:
        return False
    path = key / LOCK_FILE
    _make_run_dir(Path(run_dir), key)
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise GrpoError(f"{path}: cannot create the run directory's lock ({err.strerror})") from err
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise GrpoError(
            f"{key} is in use by another grpo run (pid {holder}, holding {LOCK_FILE}): wait for it to end, "
            "or give this run another hydra.run.dir"
        ) from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    _held[key] = descriptor
    return True


def _make_run_dir(given: Path, key: Path, setting: str = "hydra.run.dir") -> None:
    """Create the run (or sweep) directory, or say what is wrong with the value given (the lock is
    not the problem when the directory itself cannot exist)."""
    if key.exists() and not key.is_dir():
        raise GrpoError(f"{setting}={given} is a file, not a directory: name a directory for the run")
    try:
        key.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parent = next(p for p in key.parents if p.exists())  # `/` at worst
        if not parent.is_dir():
            message = f"{setting}={given}: {parent} is a file, not a directory: name a directory for the run"
            raise GrpoError(message) from None
        why = "" if err.errno == errno.ENOENT else f" ({err.strerror})"  # /proc's ENOENT: "no such file", misleading
        raise GrpoError(
            f"{setting}={given}: cannot create the directory: {parent} takes no new directories{why}; "
            "name a writable place for the run"
        ) from None
    if not os.access(key, os.W_OK | os.X_OK):
        raise GrpoError(f"{setting}={given}: the directory is not writable: name a writable place for the run")


def unlock_run_dir(run_dir: Path) -> None:
    descriptor = _held.pop(Path(run_dir).resolve(), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the descriptor releases the flock


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """The lock for one job: a multirun's jobs run one after another in one process."""
    taken = lock_run_dir(run_dir)
    try:
        yield
    finally:
        if taken:
            unlock_run_dir(run_dir)


def explicit_run_dir(overrides: list[str]) -> Path | None:
    """The `hydra.run.dir=DIR` of a single run's command line, when it is a plain path: it can be
    locked before Hydra writes .hydra/ into it. A multirun, a Hydra flag (--cfg, --help) or an
    interpolated directory (${now:...}) leave the lock to the task. An empty `hydra.run.dir=` or
    `hydra.sweep.dir=` is refused: Hydra would run in the current directory, over the user's files;
    a plain `hydra.sweep.dir` is made here, where a failure is one line, not Hydra's traceback."""
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if any(arg.startswith(f"{key}=") and not arg.split("=", 1)[1].strip("'\" ") for arg in overrides):
            raise GrpoError(
                f"{key} is empty: it would run in the current directory and overwrite its files; name a directory "
                "for the run"
            )
    sweep_dirs = [arg.split("=", 1)[1].strip("'\"") for arg in overrides if arg.startswith("hydra.sweep.dir=")]
    multirun = any(arg in ("-m", "--multirun", "hydra.mode=MULTIRUN") for arg in overrides)
    if multirun and sweep_dirs and "${" not in sweep_dirs[-1]:  # made now, as Hydra would, with a one-line error
        _make_run_dir(Path(sweep_dirs[-1]), Path(sweep_dirs[-1]).resolve(), "hydra.sweep.dir")
    if any(arg.startswith("-") or arg.startswith("hydra.mode=") for arg in overrides):
        return None
    values = [arg.split("=", 1)[1] for arg in overrides if arg.startswith("hydra.run.dir=")]
    if not values or "${" in values[-1] or not values[-1].strip("'\""):
        return None
    return Path(values[-1].strip("'\""))
