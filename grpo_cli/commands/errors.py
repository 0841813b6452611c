"""Turn user errors into one short line and a non-zero exit, tracebacks only on request."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.markup import escape

from grpo_cli.errors import GrpoError

T = TypeVar("T")
EXIT_USER_ERROR = 1


def report_user_errors(run: Callable[[], T]) -> T:
    """HYDRA_FULL_ERROR=1 re-raises, as it does for Hydra's own errors."""
    try:
        return run()
    except (GrpoError, OmegaConfBaseException) as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # soft_wrap: a FILE:LINE in the message must stay one copyable token in CI logs.
        # The message is not markup: `monitor.trackers=[wandb]` must print its brackets.
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)
        sys.exit(err.exit_code if isinstance(err, GrpoError) else EXIT_USER_ERROR)
