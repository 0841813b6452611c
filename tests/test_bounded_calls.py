"""The one runner of deadline-bound calls (`grpo_cli.bounded_calls`) that env=code_feedback's steps
and code_tests' batches share: a worker bound, a timeout from each call's own start, a batch
deadline, and a call's failure or hang costing that call only. Timings are generous margins
around sleeps of a few tenths of a second, never tight bounds."""

from __future__ import annotations

import threading
import time

from grpo_cli.bounded_calls import DONE, NOT_STARTED, RAISED, TIMED_OUT, call_all, run_bounded

HANG = threading.Event()  # never set: a call waiting on it hangs (a daemon thread, left behind)


def test_at_most_workers_calls_run_at_once() -> None:
    lock, running, most = threading.Lock(), [0], [0]

    def call() -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return 1

    outcomes = run_bounded([call] * 6, workers=2, timeout_s=30)
    assert [o.state for o in outcomes] == [DONE] * 6 and most[0] == 2


def test_the_timeout_counts_from_each_calls_own_start_not_from_the_queue() -> None:
    """Four 0.4 s calls one at a time take 1.6 s; each is well within its 1.5 s."""
    outcomes = run_bounded([lambda: time.sleep(0.4)] * 4, workers=1, timeout_s=1.5)
    assert [o.state for o in outcomes] == [DONE] * 4


def test_a_call_given_up_keeps_its_worker_until_it_returns() -> None:
    """The bound counts what runs: a sandboxed session past its timeout still runs (issue 52, item 4)."""
    slow_done = threading.Event()

    def slow() -> None:
        time.sleep(1.5)  # given up at 1 s; back at 1.5 s, within the waiting call's 1 s more
        slow_done.set()

    outcomes = run_bounded([slow, slow_done.is_set], workers=1, timeout_s=1.0)
    assert [(o.state, o.value) for o in outcomes] == [(TIMED_OUT, None), (DONE, True)]


def test_calls_waiting_on_workers_a_hang_holds_are_not_started_after_a_timeout_more() -> None:
    started = time.monotonic()
    outcomes = run_bounded([HANG.wait, lambda: 7], workers=1, timeout_s=0.3)
    assert [(o.state, o.value) for o in outcomes] == [(TIMED_OUT, None), (NOT_STARTED, None)]
    assert time.monotonic() - started >= 0.6  # the hang's own 0.3 s, then 0.3 s waiting for its worker


def test_the_batch_deadline_gives_up_running_calls_and_starts_no_more() -> None:
    outcomes = run_bounded([HANG.wait, lambda: 7], workers=1, deadline_s=0.3)
    assert [o.state for o in outcomes] == [TIMED_OUT, NOT_STARTED]


def test_a_call_that_raises_is_its_own_outcome_never_the_batchs() -> None:
    outcomes = run_bounded([lambda: 1 / 0, lambda: 7], workers=2, timeout_s=30)
    assert outcomes[0].state == RAISED and isinstance(outcomes[0].error, ZeroDivisionError)
    assert (outcomes[1].state, outcomes[1].value) == (DONE, 7)
    assert call_all([lambda: 1 / 0, HANG.wait, lambda: 7], timeout_s=0.3) == [
        (None, "ZeroDivisionError: division by zero"),
        (None, "did not return within env.timeout_s=0.3s"),
        (7, None),
    ]
