"""One runner of deadline-bound calls with a worker bound: an environment's calls for a batch of
trajectories (`rollout/episodes.py`) and a batch of sandboxed scoring jobs (`rewards/code/batch.py`)
both run through `run_bounded`, under the same rules:

- at most `workers` calls run at once (None: every call at once); the next starts when one ends;
- each call has `timeout_s` from its own start (queueing never eats into it); past it the call is
  given up (TIMED_OUT). Python cannot stop a thread, so a call given up keeps running on its daemon
  thread until it returns, and it keeps its worker until then: the bound counts what really runs (a
  sandboxed session past env.timeout_s is still a session). When calls given up hold every worker
  for another `timeout_s`, the calls still waiting are NOT_STARTED: a hang costs its batch a bounded
  wait, never the run;
- the batch may have a wall clock, `deadline_s`: then every call still running is given up and
  every call not started is NOT_STARTED;
- a call that raises is that call's outcome (RAISED), never the batch's.

A leaf module (standard library only): rollout/ and rewards/ may both import it.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

DONE, RAISED, TIMED_OUT, NOT_STARTED = "done", "raised", "timed out", "not started"


@dataclass(frozen=True)
class Outcome:
    """What became of one call: `state` DONE with its `value`, RAISED with its `error`, TIMED_OUT
    (started, given up at its timeout or the batch's deadline) or NOT_STARTED."""

    state: str
    value: Any = None
    error: BaseException | None = None


def run_bounded(
    calls: Sequence[Callable[[], Any]],
    workers: int | None = None,
    timeout_s: float | None = None,
    deadline_s: float | None = None,
    name: str = "grpo-call",
) -> list[Outcome]:
    """Each call's Outcome, in order (module docstring). `workers` None or over len(calls): all
    at once; `timeout_s` / `deadline_s` None: no limit of that kind.

    >>> [o.state for o in run_bounded([lambda: 1, lambda: 1 / 0], workers=1, timeout_s=5)]
    ['done', 'raised']
    """
    bound = len(calls) if workers is None else max(1, min(workers, len(calls)))
    outcomes: list[Outcome] = [Outcome(NOT_STARTED)] * len(calls)
    finished: queue.SimpleQueue[tuple[int, Outcome]] = queue.SimpleQueue()
    waiting, running = deque(range(len(calls))), {}  # running: index -> when it started
    given_up: set[int] = set()  # TIMED_OUT, still running on their threads: they hold their workers
    end = math.inf if deadline_s is None else time.monotonic() + deadline_s
    per_call = math.inf if timeout_s is None else timeout_s
    stalled_since = math.inf  # since when calls given up have held every worker, calls waiting
    while waiting or running:
        while waiting and len(running) + len(given_up) < bound:
            i = waiting.popleft()
            running[i] = time.monotonic()
            threading.Thread(target=_run, args=(i, calls[i], finished), daemon=True, name=name).start()
        stalled = bool(waiting) and not running
        stalled_since = min(stalled_since, time.monotonic()) if stalled else math.inf
        wake = min([end, stalled_since + per_call, *(started + per_call for started in running.values())])
        try:
            i, outcome = finished.get(timeout=max(0.0, wake - time.monotonic()) if wake < math.inf else None)
            if running.pop(i, None) is not None:  # a call given up already has its outcome
                outcomes[i] = outcome
            given_up.discard(i)  # its worker is free
        except queue.Empty:
            pass
        now = time.monotonic()
        for i in [i for i, started in running.items() if now >= min(started + per_call, end)]:
            outcomes[i] = Outcome(TIMED_OUT)
            del running[i]
            given_up.add(i)
        if now >= end or now >= stalled_since + per_call:
            break  # the calls still waiting stay NOT_STARTED
    return outcomes


def _run(i: int, call: Callable[[], Any], finished: queue.SimpleQueue) -> None:
    try:
        finished.put((i, Outcome(DONE, value=call())))
    except BaseException as err:  # the call's failure is its own outcome, never the batch's
        finished.put((i, Outcome(RAISED, error=err)))


def call_all(
    calls: Sequence[Callable[[], Any]], timeout_s: float, workers: int | None = None, key: str = "env.timeout_s"
) -> list[tuple[Any, str | None]]:
    """`run_bounded` with one timeout per call, as (value, None), or (None, why) for a call that
    raised or overstayed `timeout_s` (named as the config `key` that sets it)."""
    results: list[tuple[Any, str | None]] = []
    for outcome in run_bounded(calls, workers, timeout_s, name="grpo-env"):
        if outcome.state == DONE:
            results.append((outcome.value, None))
        elif outcome.state == RAISED:
            results.append((None, f"{type(outcome.error).__name__}: {outcome.error}"))
        else:
            results.append((None, f"did not return within {key}={timeout_s:g}s"))
    return results


class LocalWorker:
    """A daemon thread that runs one caller's calls (a reward source's) one at a time, so a call
    under a timeout costs a hand-over, not a thread start: a thread started per call cost 2.3 ms of
    the tiny default's 28 ms step, where the rewards themselves take 1.3 ms. A call past its timeout
    keeps the thread busy (Python cannot stop it): `idle` says so until it ends."""

    def __init__(self, name: str) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self.last: Future | None = None
        # daemon: a hung call must not keep the interpreter from exiting
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def idle(self) -> bool:
        """Whether the last call has ended (a new one would start at once)."""
        return self.last is None or self.last.done()

    def submit(self, fn: Callable[[], Any]) -> Future:
        """`fn()` on the worker's thread; the future's result is None when it ended by a BaseException
        (SystemExit and the like; an ordinary exception is the caller's to catch inside `fn`)."""
        self.last = Future()
        self.calls.put((fn, self.last))
        return self.last

    def close(self) -> None:
        """The thread ends after the call it is running, if any."""
        self.calls.put(None)

    def _serve(self) -> None:
        while (item := self.calls.get()) is not None:
            fn, call = item
            try:
                call.set_result(fn())
            except BaseException:  # noqa: BLE001  (SystemExit included: the call ends without a result)
                call.set_result(None)
