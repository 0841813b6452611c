"""Turn user errors into one short line and a non-zero exit, tracebacks only on request."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from omegaconf.errors import OmegaConfBaseException
from rich.text import Text

from grpo_cli.errors import GrpoError
from grpo_cli.monitor.terminal import stderr_console

T = TypeVar("T")
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT: a Ctrl-C is neither success nor a user error
# The machine's state, not a bug: a full disk, a quota, a read-only or forbidden directory, ulimit -f.
CANNOT_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def report_user_errors(run: Callable[[], T]) -> T:
    """HYDRA_FULL_ERROR=1 re-raises, as it does for Hydra's own errors."""
    try:
        return run()
    except (GrpoError, OmegaConfBaseException) as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # soft_wrap: a FILE:LINE in the message must stay one copyable token in CI logs.
        # The message is user text, printed as written: a Text is never read as markup (`[wandb]`
        # keeps its brackets) nor for emoji codes (a target `a:b:c` printed as `a🅱c`).
        console = stderr_console(soft_wrap=True, markup=False, highlight=False)
        console.print(Text.assemble(("error:", "bold red"), " ", str(err)))
        sys.exit(err.exit_code if isinstance(err, GrpoError) else EXIT_USER_ERROR)


@contextmanager
def cannot_write_errors(run_dir: Path, checkpoints: bool) -> Iterator[None]:
    """A run that cannot write (CANNOT_WRITE) stops in one line naming the file and, for a command
    that saves `checkpoints`, says what it leaves: every checkpoint is written to a temporary
    directory and renamed into place, so those already there are whole and a resume continues."""
    try:
        yield
    except OSError as err:
        if err.errno not in CANNOT_WRITE:
            raise
        message = f"{err.filename or run_dir}: {err.strerror} ({errno.errorcode[err.errno]}); the run stopped"
        if checkpoints:
            from grpo_cli.checkpoint import latest_checkpoint

            latest = latest_checkpoint(run_dir)
            message += (
                f"; its checkpoints stand (newest {latest}): resume with the same command once it can write"
                if latest
                else "; no checkpoint had been written"
            )
        raise GrpoError(message) from err
