"""Ctrl-C and SIGTERM stop a run on a finished step, saved; a resume continues from it.

Clusters preempt with SIGTERM (SLURM sends it, then SIGKILL once its grace period ends), so SIGTERM
is handled as Ctrl-C is, and `Interrupted` carries which one it was (the exit code: 130 or 143).

One process: a signal before the first optimizer step of a step rolls the step back, and the last
finished step is saved. Between that optimizer step and the end of the step's observers the live
state is neither the step before nor the step after (a checkpoint there would disagree with
metrics.jsonl), so a signal there is deferred to the end of the window (seconds). A second Ctrl-C
there is obeyed at once, and then the previous checkpoint is the one to resume from; a second
SIGTERM is not: a cluster sends one to every process of the job and torchrun forwards another, and
the cluster's SIGKILL is the one that insists.

Data-parallel: the processes are at different points of a step when a signal lands, and one of
them may get it alone, so each defers it for the whole loop and all of them agree at the end of
every step (`agreed`, one small collective) to save that step together and stop.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

import torch

from grpo_cli.training.distributed import World

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal: every `except KeyboardInterrupt` treats a SIGTERM as a Ctrl-C."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The shell's code for the signal: 130 for Ctrl-C (a plain KeyboardInterrupt too), 143 for SIGTERM."""
    return 128 + (interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT)


def stopped_by(interrupt: KeyboardInterrupt) -> str:
    """How the run ended, for its last lines: `interrupted` (Ctrl-C) or `stopped by SIGTERM`."""
    signum = interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"


# the signals `_raise_interrupted` raised, until the step loop handled one: Python drops an exception
# raised while the garbage collector runs a __del__ (it prints "Exception ignored in ..." and carries
# on), and a signal landing there would be lost; the loop raises it again at its next step (`missed`)
_raised: list[signal.Signals] = []


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    _raised.append(signal.Signals(signum))
    raise Interrupted(signum)


def _quiet_when_dropped(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """sys.unraisablehook without the traceback Python prints for an Interrupted dropped inside a
    __del__: the step loop obeys it at its next step (`missed`), and a user would read a crash."""

    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            hook(unraisable)

    return quiet


def missed() -> signal.Signals | None:
    """A signal raised and never handled (dropped inside a __del__), or None; forgotten once asked."""
    signum = _raised[-1] if _raised else None
    _raised.clear()
    return signum


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """In the block, SIGTERM raises `Interrupted` where Ctrl-C raises KeyboardInterrupt (a
    command's whole run, start-up included); a no-op outside the main thread, where no handler lives."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_waits() -> Iterator[None]:
    """A checkpoint being written finishes before a SIGTERM acts: a cluster repeats its SIGTERM (and
    torchrun forwards another) while the rolled-back step is saved, and cutting that write would
    leave nothing to resume from. The SIGTERM is delivered again once the block ends; Ctrl-C still
    stops at once (the temporary directory is removed, the previous checkpoint stands)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if received:
        signal.raise_signal(signal.SIGTERM)  # to whatever handles it outside: raise, defer, or end


class DeferredInterrupt:
    """The trainer's signals. `loop(data_parallel)` wraps the whole loop and a `with` block each step.
    One process: `arm()` starts deferring (the trainer calls it just before the first optimizer
    step) and leaving the block raises the deferred `Interrupted`, if any. Data-parallel: deferred
    from the loop's start; `agreed(world)` at each step's end says whether any process got one."""

    def __init__(self) -> None:
        self.pending: signal.Signals | None = None  # the first signal deferred, if any
        self.engaged = False  # arm() was called in this block: the weights have started to move
        self._previous: dict[int, object] = {}  # the handlers arm() replaced, restored when the block ends
        self._data_parallel = False
        self._inside = False  # only a `with` block restores the handlers: outside one, arm() is a no-op

    @contextlib.contextmanager
    def loop(self, data_parallel: bool) -> Iterator[None]:
        """SIGTERM raises `Interrupted` like Ctrl-C for the loop; data-parallel, both are deferred."""
        self.pending, self._data_parallel = None, data_parallel
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers live in the main thread; elsewhere the signals are not ours anyway
            return
        handler = self._handle if data_parallel else _raise_interrupted
        _raised.clear()
        signals = STOP_SIGNALS  # Ctrl-C too: KeyboardInterrupt's own handler would leave no trace when dropped
        previous = {signum: signal.signal(signum, handler) for signum in signals}
        unraisable = sys.unraisablehook
        sys.unraisablehook = _quiet_when_dropped(unraisable)
        try:
            yield
        finally:
            sys.unraisablehook = unraisable
            for signum, old in previous.items():
                signal.signal(signum, old)  # type: ignore[arg-type]
            self._data_parallel = False

    def arm(self) -> None:
        # the deferring handlers first, `engaged` after: a signal between the two would otherwise find
        # the weights moving (engaged) with the raising handler still in place, be taken for a second
        # Ctrl-C, and stop the run unsaved
        deferring = self._data_parallel or not self._inside or self._previous  # already, or no block to end it
        if not deferring and threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        self.engaged = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is not None and signum == signal.SIGINT:  # a second Ctrl-C: the user means it
            raise Interrupted(signum)
        if self.pending is None:
            self.pending = signal.Signals(signum)

    def agreed(self, world: World) -> signal.Signals | None:
        """Data-parallel, at the end of a step in every process: the signal any of them deferred
        (SIGTERM if one did: the job is being preempted, whatever else was pressed), else None."""
        if not self._data_parallel:
            return None
        got = torch.tensor([float(self.pending == s) for s in STOP_SIGNALS], dtype=torch.float64)
        counts = world.sum(got).tolist()
        for signum, count in reversed(list(zip(STOP_SIGNALS, counts))):
            if count > 0:
                return signum
        return None

    def __enter__(self) -> DeferredInterrupt:
        self.engaged = False
        self._inside = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inside = False
        for signum, old in self._previous.items():
            signal.signal(signum, old)  # type: ignore[arg-type]
        self._previous = {}
        if self.pending is not None and not self._data_parallel:
            signum, self.pending = self.pending, None
            if exc_type is None:
                raise Interrupted(signum)
