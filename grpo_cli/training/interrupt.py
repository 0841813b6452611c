"""Ctrl-C while the weights move is held until the step's observers have run.

Between the first optimizer step of a step and the end of its observers, the live state is
neither the step before nor the step after: a checkpoint there would disagree with metrics.jsonl.
So a first Ctrl-C there is deferred to the end of the window (seconds); a second one is obeyed at
once, and then the previous checkpoint is the one to resume from.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class DeferredInterrupt:
    """Context manager; `arm()` starts deferring (the trainer calls it just before the first
    optimizer step), and leaving the block raises the deferred KeyboardInterrupt, if any."""

    def __init__(self) -> None:
        self.pending = False
        self.engaged = False  # arm() was called in this block: the weights have started to move
        self._previous: object = None
        self._armed = False
        self._inside = False  # only a `with` block restores the handler: outside one, arm() is a no-op

    def arm(self) -> None:
        self.engaged = True
        if not self._inside or self._armed or threading.current_thread() is not threading.main_thread():
            return  # signal handlers live in the main thread; elsewhere Ctrl-C is not ours anyway
        self._previous = signal.signal(signal.SIGINT, self._handle)
        self._armed = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pending:  # the second Ctrl-C: the user means it
            raise KeyboardInterrupt
        self.pending = True

    def __enter__(self) -> DeferredInterrupt:
        self.pending = self.engaged = False
        self._inside = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inside = False
        if self._armed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._armed = False
        if self.pending and exc_type is None:
            raise KeyboardInterrupt
