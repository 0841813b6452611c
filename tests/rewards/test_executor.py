"""The reward executor: failures become NaN with an error, a hung function costs one timeout."""

from __future__ import annotations

import math
import os
import time

import pytest

from grpo_cli.rewards import RewardExecutor, RewardSource
from tests.rewards import pool_functions as pf

PROMPTS, COMPLETIONS = ["p"] * 4, ["a", "bb", "ccc", "dddd"]


def all_exited(processes, within_s: float = 10.0) -> bool:
    """Workers are terminated at once; on a loaded 2-core machine reaping them can lag a little."""
    deadline = time.monotonic() + within_s
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(p.is_alive() for p in processes)


def run(executor, *sources, columns=None):
    return executor.run(list(sources), PROMPTS, COMPLETIONS, columns or {})


def is_nan(values):
    return all(math.isnan(v) for v in values)


# ---- in this process (num_workers = 0) ---------------------------------------------------------
def test_raising_none_and_wrong_length_functions_score_nan_with_an_error():
    def wrong_length(prompts, completions, **_):
        return [1.0]

    def text(prompts, completions, **_):
        return ["x", 2, float("inf"), True]

    with RewardExecutor(num_workers=0, default_timeout_s=5.0) as executor:
        out = run(
            executor,
            RewardSource("flaky", pf.flaky),
            RewardSource("half", pf.half_none),
            RewardSource("short", wrong_length),
            RewardSource("text", text),
            RewardSource("ok", pf.length),
        )
    assert is_nan(out["flaky"].values) and out["flaky"].error == "ValueError: flaky"
    assert out["half"].values[0] == 1.0 and math.isnan(out["half"].values[1]) and out["half"].error is None
    assert is_nan(out["short"].values) and out["short"].error == "returned 1 values for 4 completions"
    # text and non-finite values are not rewards; a bool is 0/1
    assert is_nan(out["text"].values[:1]) and out["text"].values[1] == 2.0
    assert math.isnan(out["text"].values[2]) and out["text"].values[3] == 1.0
    assert out["ok"].values == [1.0, 2.0, 3.0, 4.0] and out["ok"].error is None
    assert list(out) == ["flaky", "half", "short", "text", "ok"]  # the order of the sources


def test_columns_and_kwargs_reach_the_function():
    source = RewardSource("col", pf.with_column, kwargs={"scale": 2.0})
    with RewardExecutor(0, 5.0) as executor:
        out = run(executor, source, columns={"answer": ["a", "x", "ccc", "x"]})
    assert out["col"].values == [2.0, 0.0, 2.0, 0.0]


def test_in_process_timeout_returns_control_and_skips_the_stuck_function_until_it_ends():
    """Without workers a pure-Python hang cannot be interrupted: the call runs in a thread the
    executor stops waiting for; until that thread ends the function is not called again."""
    sleepy = RewardSource("sleepy", pf.sleepy, kwargs={"seconds": 2.0}, timeout_s=0.5)
    with RewardExecutor(num_workers=0, default_timeout_s=60.0) as executor:
        start = time.monotonic()
        out = run(executor, sleepy, RewardSource("ok", pf.length))
        assert time.monotonic() - start < 1.5
        assert is_nan(out["sleepy"].values) and out["sleepy"].error == "timed out after 0.5s"
        assert out["ok"].values == [1.0, 2.0, 3.0, 4.0]
        again = run(executor, sleepy)["sleepy"]
        assert is_nan(again.values) and "still running" in again.error


def test_no_timeout_runs_in_the_calling_thread():
    import threading

    def which_thread(prompts, completions, **_):
        return [float(threading.get_ident())] * len(completions)

    with RewardExecutor(0, default_timeout_s=0) as executor:
        out = run(executor, RewardSource("t", which_thread))
    assert out["t"].values[0] == float(threading.get_ident())


def test_parallel_sources_run_in_this_process_when_there_are_no_workers():
    with RewardExecutor(num_workers=0, default_timeout_s=5.0) as executor:
        out = run(executor, RewardSource("pid", pf.worker_pid, parallel=True))
    assert out["pid"].values[0] == float(os.getpid()) and executor.pools_started == 0


# ---- the worker pool ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    """One spawned pool for the module: starting workers costs about a second each time."""
    with RewardExecutor(num_workers=2, default_timeout_s=30.0) as executor:
        yield executor


def test_pool_runs_parallel_sources_in_worker_processes_and_the_rest_here(pool):
    out = run(
        pool,
        RewardSource("pid", pf.worker_pid, parallel=True),
        RewardSource("flaky", pf.flaky, parallel=True),
        RewardSource("half", pf.half_none, parallel=True),
        RewardSource("here", pf.worker_pid),
    )
    assert out["pid"].values[0] != float(os.getpid())
    assert out["here"].values[0] == float(os.getpid())
    assert is_nan(out["flaky"].values) and out["flaky"].error == "ValueError: flaky"
    assert math.isnan(out["half"].values[1]) and out["half"].values[0] == 1.0


def test_pool_timeout_returns_fast_then_the_pool_is_rebuilt_and_the_next_batch_works(pool):
    """A function sleeping 20 s with a 1 s timeout: the batch returns in about a second, its
    worker is terminated, and the next batch runs on fresh workers."""
    before = run(pool, RewardSource("pid", pf.worker_pid, parallel=True))["pid"].values[0]
    old_processes = list(pool._pool._processes.values())
    started = pool.pools_started
    sleepy = RewardSource("sleepy", pf.sleepy, kwargs={"seconds": 20.0}, timeout_s=1.0, parallel=True)

    t0 = time.monotonic()
    out = run(pool, sleepy, RewardSource("len", pf.length, parallel=True))
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0, elapsed  # well under the 20 s sleep
    assert is_nan(out["sleepy"].values) and out["sleepy"].error == "timed out after 1.0s"
    assert out["len"].values == [1.0, 2.0, 3.0, 4.0]  # the other worker was not held up
    assert pool._pool is None and all_exited(old_processes)  # torn down, not leaked

    after = run(pool, RewardSource("pid", pf.worker_pid, parallel=True), RewardSource("len", pf.length, parallel=True))
    assert pool.pools_started == started + 1
    assert after["pid"].error is None and after["pid"].values[0] != before
    assert after["len"].values == [1.0, 2.0, 3.0, 4.0]


def test_more_hung_functions_than_workers_still_return(pool):
    """Every worker hangs: the pool is rebuilt within the batch for the calls still waiting."""
    sleepers = [
        RewardSource(f"s{i}", pf.sleepy, kwargs={"seconds": 20.0}, timeout_s=0.5, parallel=True) for i in range(2)
    ]
    t0 = time.monotonic()
    out = run(pool, *sleepers, RewardSource("len", pf.length, parallel=True))
    assert time.monotonic() - t0 < 8.0
    assert all(out[s.name].error == "timed out after 0.5s" for s in sleepers)
    assert out["len"].values == [1.0, 2.0, 3.0, 4.0]


def test_a_crashed_worker_costs_its_batch_and_the_pool_is_rebuilt(pool):
    out = run(pool, RewardSource("crash", pf.crash, parallel=True))
    assert is_nan(out["crash"].values) and "worker process died" in out["crash"].error
    after = run(pool, RewardSource("len", pf.length, parallel=True))
    assert after["len"].values == [1.0, 2.0, 3.0, 4.0] and after["len"].error is None


def test_close_ends_the_workers():
    executor = RewardExecutor(num_workers=1, default_timeout_s=30.0)
    run(executor, RewardSource("len", pf.length, parallel=True))
    processes = list(executor._pool._processes.values())
    executor.close()
    assert executor._pool is None and all_exited(processes)
