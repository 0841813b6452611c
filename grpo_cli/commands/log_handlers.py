"""The job logging's console half (conf/hydra/job_logging/*.yaml): rich on a terminal, the log
file's plain lines anywhere else.

Without a terminal (stderr redirected to a file, a pipe, CI) rich has no width to fit and lays each
record out at 80 columns, padded and wrapped: a path is cut in half and a grep misses it. There a
record is one line, exactly as the run's log file has it.
"""

from __future__ import annotations

import logging
import sys

from rich.logging import RichHandler

PLAIN_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"  # one record, one line, never wrapped


def plain_formatter() -> logging.Formatter:
    """The log file's lines (`train.log`), and the console's when it is not a terminal."""
    return logging.Formatter(PLAIN_FORMAT)


def console_handler() -> logging.Handler:
    """Rich's aligned, coloured columns on a terminal (it adds time and level itself); elsewhere a
    plain stream handler with PLAIN_FORMAT."""
    if sys.stderr.isatty():
        handler: logging.Handler = RichHandler(show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        return handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(plain_formatter())
    return handler
