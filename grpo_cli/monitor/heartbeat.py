"""A progress line for long work that nobody watches on a terminal (CI logs, files, `2> log`).

On a real model a single eval batch or training step can take minutes, and a log that says nothing
for that long looks like a hang. A `Heartbeat` logs a line (to the console and the run's log file)
whenever `HEARTBEAT_S` pass without one, with what the work under way is doing (`stage`), e.g.
`train: 0/2 steps, 10m00s elapsed, ETA -; step 1: sampling, 120/512 tokens`.
"""

from __future__ import annotations

import logging
import threading
import time

HEARTBEAT_S = 30.0  # the longest a plain log goes without a progress line
log = logging.getLogger("grpo")


def format_seconds(seconds: float) -> str:
    """Short enough for a log line.

    >>> format_seconds(42.4), format_seconds(125), format_seconds(3725)
    ('42s', '2m05s', '1h02m05s')
    """
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Heartbeat:
    """A context manager: a thread that logs `label done/total unit, elapsed, ETA` whenever
    `every_s` pass without a line (`touch()` says one was just printed elsewhere). The ETA is the
    rate since the start over the work still to do; work `done` before the start (a resume) does
    not count towards the rate. `stage` (set from the main thread) says what the work under way is
    doing; empty: nothing to add."""

    def __init__(self, label: str, total: int, unit: str, enabled: bool, done: int = 0, every_s: float = HEARTBEAT_S):
        self.label, self.total, self.unit, self.enabled, self.every_s = label, total, unit, enabled, every_s
        self.done = self.start_done = done
        self.stage = ""
        self.start = self.last_line = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{label}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.start = self.last_line = time.monotonic()
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def advance(self, amount: int = 1) -> None:
        self.done += amount

    def touch(self) -> None:
        self.last_line = time.monotonic()

    def eta(self) -> str:
        elapsed, progressed = time.monotonic() - self.start, self.done - self.start_done
        if progressed <= 0:
            return "-"
        return format_seconds(elapsed / progressed * max(self.total - self.done, 0))

    def line(self) -> str:
        elapsed = format_seconds(time.monotonic() - self.start)
        line = f"{self.label}: {self.done}/{self.total} {self.unit}, {elapsed} elapsed, ETA {self.eta()}"
        stage = self.stage  # one read: the main thread may replace it meanwhile
        return f"{line}; {stage}" if stage else line

    def _run(self) -> None:
        while not self._stop.wait(max(self.last_line + self.every_s - time.monotonic(), 0.05)):
            if time.monotonic() - self.last_line >= self.every_s:
                log.info(self.line())
                self.touch()
