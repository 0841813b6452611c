"""Run reward sources on a batch: failures become NaN, a hung function costs one timeout, never the run.

Sources with `parallel=True` run on a pool of spawned worker processes (spawn, never fork: the
trainer holds CUDA state and threads that a forked child would inherit half-initialised). The
rest, and reward models always, run in this process. A pool call past its timeout scores NaN
and the pool is torn down (its processes terminated) and rebuilt for the next batch.

In-process calls with a timeout run in a daemon thread the caller waits on with a deadline:
Python cannot interrupt a pure-Python hang in a thread, so the thread is abandoned and keeps
running, but training gets control back. Until that thread ends, the source scores NaN without
being called again (no pile-up of threads). A function that relies on `signal` (alarm-based
timeouts) only works in the main thread: give it `timeout_s: 0` or `parallel: true`.
"""

from __future__ import annotations

import importlib
import inspect
import math
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.bounded_calls import LocalWorker
from grpo_cli.rewards.batch import COMPLETION_IDS
from grpo_cli.rewards.rows import RowScores, describe
from grpo_cli.rewards.sources import RewardSource, required_columns
from grpo_cli.rewards.trl_style import MULTI_TURN_COLUMNS, LoggedScores

POOL_START_TIMEOUT_S = 120.0  # spawning workers and importing reward modules; not counted in a call's timeout
CLOSE_GRACE_S = 5.0  # close() lets idle workers exit this long before terminating them


@dataclass
class BatchScores:
    """One source's scores for a batch: NaN where it gave no usable number."""

    values: list[float]
    error: str | None = None  # "ValueError: flaky", "timed out after 2.0s", ...: the whole batch failed
    elapsed_s: float = 0.0
    row_errors: dict[int, str] = field(default_factory=dict)  # rows `score_each` caught raising: NaN there only
    missing: dict[str, list[int]] = field(default_factory=dict)  # column -> rows without a value: not judged, NaN
    # the first value that was neither a number nor None, e.g. "row 0 is str '0.5', not a number": NaN, and
    # the reason the alerts give for it (a reward returning text is the function's bug, not the completion's)
    non_numeric: str | None = None
    # what a TRL-style function logged (`LoggedScores`): log_metric's name -> values, log_extra's column -> rows
    logged: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)
    # rows a multi-turn rollout's environment failed -> why (its env_error): NaN, and never the function's
    # failure, for the function had nothing of that row's to judge (rewards.scoring.with_environment_columns)
    env_failed: dict[int, str] = field(default_factory=dict)

    def judged(self) -> list[float]:
        """The values of the rows the function was given something to judge on: not a row missing a
        column it needs (the data's gap), nor a row whose environment failed (the environment's)."""
        skipped = {i for rows in self.missing.values() for i in rows} | set(self.env_failed)
        return [v for i, v in enumerate(self.values) if i not in skipped]


def concat_scores(parts: list[dict[str, BatchScores]], concurrent: bool = False) -> dict[str, BatchScores]:
    """One batch's raw scores from several parts in order (the kept groups of each dynamic-sampling
    draw; each data-parallel process's share), every field carried, rows renumbered. The first error
    of a part stands for the whole: one failed part makes the batch a failed one, for failure
    isolation counts batches. `concurrent`: the parts ran at once (processes), so the batch took
    the longest part's time, not their sum.

    >>> a = {"f": BatchScores([1.0], row_errors={0: "boom"})}
    >>> b = {"f": BatchScores([2.0, 3.0], missing={"x": [1]}, env_failed={0: "reset: down"})}
    >>> both = concat_scores([a, b])["f"]
    >>> both.values, both.row_errors, both.missing, both.env_failed
    ([1.0, 2.0, 3.0], {0: 'boom'}, {'x': [2]}, {1: 'reset: down'})
    """
    out = {}
    for name in parts[0]:
        values: list[float] = []
        row_errors: dict[int, str] = {}
        env_failed: dict[int, str] = {}
        missing: dict[str, list[int]] = {}
        for part in parts:
            s = part[name]
            row_errors.update({len(values) + row: error for row, error in s.row_errors.items()})
            env_failed.update({len(values) + row: why for row, why in s.env_failed.items()})
            for column, rows in s.missing.items():
                missing.setdefault(column, []).extend(len(values) + row for row in rows)
            values += s.values
        error = next((part[name].error for part in parts if part[name].error), None)
        non_numeric = next((part[name].non_numeric for part in parts if part[name].non_numeric), None)
        elapsed = max(part[name].elapsed_s for part in parts) if concurrent else sum(p[name].elapsed_s for p in parts)
        logged: dict[str, list[float]] = {}
        for part in parts:
            for metric, logged_values in part[name].logged.items():
                logged.setdefault(metric, []).extend(logged_values)
        columns = dict.fromkeys(c for part in parts for c in part[name].extra)
        extra = {c: [v for p in parts for v in p[name].extra.get(c, [None] * len(p[name].values))] for c in columns}
        out[name] = BatchScores(values, error, elapsed, row_errors, missing, non_numeric, logged, extra, env_failed)
    return out


def _numeric(value: Any) -> bool:
    """None (not judged) or a value float() takes (NaN and inf included, as a number's edge cases)."""
    if value is None:
        return True
    if isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _as_float(value: Any) -> float:
    """None, text, and anything without a finite float value become NaN."""
    if value is None or isinstance(value, (str, bytes)):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def _score_rows_with_columns(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    missing: dict[str, list[int]],
) -> BatchScores:
    """evaluate_source on the rows that have every column the function needs; NaN on the others."""
    n = len(completions)
    skipped = {i for rows in missing.values() for i in rows}
    keep = [i for i in range(n) if i not in skipped]
    part = BatchScores([], None)
    if keep:
        part_columns = {k: [v[i] for i in keep] for k, v in columns.items()}
        part = evaluate_source(fn, kwargs, [prompts[i] for i in keep], [completions[i] for i in keep], part_columns)
    values = [math.nan] * n
    for i, value in zip(keep, part.values):
        values[i] = value
    row_errors = {keep[j]: error for j, error in part.row_errors.items()}
    return BatchScores(values, part.error, part.elapsed_s, row_errors, missing, part.non_numeric)


def evaluate_source(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
) -> BatchScores:
    """Call one reward function and turn whatever it does into a BatchScores.

    Module level so a worker process can import it.

    >>> evaluate_source(lambda p, c, **_: [1, None, "x"], {}, ["q"] * 3, ["a", "b", "c"], {}).values
    [1.0, nan, nan]
    >>> evaluate_source(lambda p, c, **_: [1.0], {}, ["q"] * 2, ["a", "b"], {}).error
    'returned 1 values for 2 completions'

    A row without a value (None) in a column the function needs is not passed to it: scored
    against None, `exact_match` would compare with the string "None". (The start-up check,
    `check_columns`, makes sure the data has the column at all.)

    >>> def exact(prompts, completions, answer, **_): return [float(c == a) for c, a in zip(completions, answer)]
    >>> scores = evaluate_source(exact, {}, ["q"] * 3, ["1", "None", "2"], {"answer": ["1", None, "3"]})
    >>> scores.values, scores.missing
    ([1.0, nan, 0.0], {'answer': [1]})
    """
    n = len(completions)
    needed = [c for c in required_columns(fn) if c not in kwargs]
    missing = {  # a column absent from the batch (no row of it has one): every row misses it
        c: rows for c in needed if (rows := [i for i, v in enumerate(columns.get(c) or [None] * n) if v is None])
    }
    if missing:
        return _score_rows_with_columns(fn, kwargs, prompts, completions, columns, missing)
    start = time.perf_counter()
    try:
        # kwargs come last and win: a configured value may stand in for (or override) a column.
        raw = fn(prompts, completions, **{**visible_columns(fn, columns), **kwargs})
    except Exception as err:  # a failing user function must not stop training: its batch scores NaN
        return BatchScores([math.nan] * n, describe(err), time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    if raw is None:
        return BatchScores([math.nan] * n, "returned None instead of a list", elapsed)
    try:
        length = len(raw)
    except TypeError:
        return BatchScores([math.nan] * n, f"returned {type(raw).__name__}, not a list", elapsed)
    if length != n:
        return BatchScores([math.nan] * n, f"returned {length} values for {n} completions", elapsed)
    row_errors = dict(raw.row_errors) if isinstance(raw, RowScores) else {}  # `score_each` isolated them
    values = [_as_float(v) for v in raw]
    odd = next((i for i, v in enumerate(raw) if not _numeric(v)), None)
    non_numeric = None if odd is None else f"row {odd} is {type(raw[odd]).__name__} {raw[odd]!r:.40}, not a number"
    logged, extra = (raw.metrics, _row_columns(raw.extra, n)) if isinstance(raw, LoggedScores) else ({}, {})
    return BatchScores(values, None, elapsed, row_errors, non_numeric=non_numeric, logged=logged, extra=extra)


def visible_columns(fn: Callable[..., Any], columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The batch's columns for `fn`: `completion_ids` only if it names that parameter (token ids are
    bulky, and a function written before they were passed keeps the columns it was written for);
    likewise a multi-turn rollout's environment instances and conversations (`MULTI_TURN_COLUMNS`)."""
    hidden = [c for c in (COMPLETION_IDS, *MULTI_TURN_COLUMNS) if c in columns]
    if not hidden:
        return columns
    try:
        named = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        named = set()
    return {k: v for k, v in columns.items() if k not in hidden or k in named}


def _row_columns(extra: dict[str, list[Any]], n: int) -> dict[str, list[Any]]:
    """log_extra's columns that hold one value per completion; another length would misplace rows."""
    return {column: values for column, values in extra.items() if len(values) == n}


def _init_worker(modules: list[str], barrier: Any) -> None:
    """Runs once per worker: Ctrl-C is the parent's to handle, and the reward modules are
    imported here so their import time does not count against the first call's timeout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the call itself will report it, as that source's error
            pass
    barrier.wait()


def _ready() -> bool:
    return True


class RewardExecutor:
    """`run(sources, prompts, completions, columns) -> {name: BatchScores}` with timeouts.

    `num_workers` worker processes for `parallel` sources (0: everything in this process);
    `default_timeout_s` for sources without their own `timeout_s` (<= 0 or None: no limit).
    """

    def __init__(self, num_workers: int = 0, default_timeout_s: float | None = 60.0) -> None:
        self.num_workers = max(0, int(num_workers))
        self.default_timeout_s = default_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._pool_modules: tuple[str, ...] = ()
        self._workers: dict[str, LocalWorker] = {}  # in-process calls with a timeout, a thread per source
        self.pools_started = 0  # how many pools were built: a rebuild after a timeout adds one

    # ---- public ------------------------------------------------------------------------
    def run(
        self,
        sources: list[RewardSource],
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, list[Any]],
    ) -> dict[str, BatchScores]:
        pooled = [s for s in sources if s.parallel and self.num_workers > 0]
        local = [s for s in sources if not (s.parallel and self.num_workers > 0)]
        results: dict[str, BatchScores] = {}
        pending: deque[RewardSource] = deque(pooled)
        in_flight: dict[Future, tuple[RewardSource, float]] = {}
        free = 0
        if pooled:
            error = self._ensure_pool(pooled)
            if error is not None:
                for s in pooled:
                    results[s.name] = BatchScores([math.nan] * len(completions), error)
                pending.clear()
            free = self.num_workers
        args = (prompts, completions, columns)
        # Pool calls start first so they overlap the in-process ones.
        free = self._submit(pending, in_flight, free, args)
        for source in local:
            results[source.name] = self._run_local(source, *args)
        hung = 0
        while in_flight:
            next_deadline = min(deadline for _, deadline in in_flight.values())
            timeout = None if math.isinf(next_deadline) else max(0.0, next_deadline - time.monotonic())
            done, _ = wait(list(in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
            for future in done:
                source, _ = in_flight.pop(future)
                results[source.name] = self._collect(future, len(completions))
                free += 1
            now = time.monotonic()
            for future, (source, deadline) in list(in_flight.items()):
                if now >= deadline and not future.done():
                    del in_flight[future]  # its worker stays busy (hung): that slot is not freed
                    results[source.name] = BatchScores(
                        [math.nan] * len(completions), f"timed out after {self._timeout(source)}s"
                    )
                    hung += 1
            if pending and free == 0 and not in_flight:  # every worker hung: rebuild to go on
                self._stop_pool(grace_s=0.0)
                error = self._ensure_pool(list(pending))
                if error is not None:
                    for s in pending:
                        results[s.name] = BatchScores([math.nan] * len(completions), error)
                    pending.clear()
                free, hung = self.num_workers, 0
            free = self._submit(pending, in_flight, free, args)
        if hung or (self._pool is not None and getattr(self._pool, "_broken", False)):
            self._stop_pool(grace_s=0.0)  # a hung worker would never take another call
        return {s.name: results[s.name] for s in sources}

    def close(self) -> None:
        self._stop_pool(grace_s=CLOSE_GRACE_S)
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

    def __enter__(self) -> RewardExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- in this process ---------------------------------------------------------------
    def _timeout(self, source: RewardSource) -> float | None:
        timeout = source.timeout_s if source.timeout_s is not None else self.default_timeout_s
        return timeout if timeout is not None and timeout > 0 else None

    def _run_local(
        self, source: RewardSource, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
    ) -> BatchScores:
        n = len(completions)
        worker = self._workers.get(source.name)
        if worker is not None and not worker.idle():
            return BatchScores([math.nan] * n, "skipped: an earlier call that timed out is still running")
        timeout = self._timeout(source)
        if timeout is None:
            return evaluate_source(source.fn, source.kwargs, prompts, completions, columns)
        if worker is None:
            worker = self._workers[source.name] = LocalWorker(f"reward-{source.name}")
        call = worker.submit(lambda: evaluate_source(source.fn, source.kwargs, prompts, completions, columns))
        try:
            result = call.result(timeout)
        except FutureTimeout:
            return BatchScores([math.nan] * n, f"timed out after {timeout}s", timeout)
        if result is None:  # SystemExit and friends end the call without a result
            return BatchScores([math.nan] * n, "exited without returning")
        return result

    # ---- the worker pool ---------------------------------------------------------------
    def _submit(
        self,
        pending: deque[RewardSource],
        in_flight: dict[Future, tuple[RewardSource, float]],
        free: int,
        args: tuple[list[Any], list[Any], dict[str, list[Any]]],
    ) -> int:
        """At most one call per free worker, so a call's clock starts when a worker takes it."""
        while pending and free > 0 and self._pool is not None:
            source = pending.popleft()
            timeout = self._timeout(source)
            try:
                prompts, completions, columns = args  # a worker gets only the columns its function sees
                future = self._pool.submit(
                    evaluate_source, source.fn, source.kwargs, prompts, completions, visible_columns(source.fn, columns)
                )
            except BrokenProcessPool as err:  # a worker died on an earlier call
                future = Future()
                future.set_exception(err)
            in_flight[future] = (source, math.inf if timeout is None else time.monotonic() + timeout)
            free -= 1
        return free

    @staticmethod
    def _collect(future: Future, n: int) -> BatchScores:
        try:
            return future.result()
        except BrokenProcessPool:
            return BatchScores([math.nan] * n, "worker process died (the pool is rebuilt for the next batch)")
        except Exception as err:  # unpicklable arguments or results land here
            return BatchScores([math.nan] * n, describe(err))

    def _ensure_pool(self, sources: list[RewardSource]) -> str | None:
        """Start the pool if there is none and wait until every worker is up; an error text if not."""
        modules = tuple(sorted({getattr(s.fn, "__module__", None) or "" for s in sources} - {""}))
        if self._pool is not None and getattr(self._pool, "_broken", False):
            self._stop_pool(grace_s=0.0)
        if self._pool is not None and set(modules) <= set(self._pool_modules):
            return None
        if self._pool is not None:  # new modules to preload: cheaper to restart than to time out
            self._stop_pool(grace_s=CLOSE_GRACE_S)
        # The barrier holds every worker in its initializer until all of them (and this process)
        # arrive, so each warm-up call below spawns its own worker and all are ready afterwards.
        barrier = self._context.Barrier(self.num_workers + 1)
        self._pool = ProcessPoolExecutor(
            self.num_workers, mp_context=self._context, initializer=_init_worker, initargs=(list(modules), barrier)
        )
        self._pool_modules = modules
        self.pools_started += 1
        try:
            warmups = [self._pool.submit(_ready) for _ in range(self.num_workers)]
            barrier.wait(POOL_START_TIMEOUT_S)
            for future in warmups:
                future.result(timeout=POOL_START_TIMEOUT_S)
        except Exception as err:  # BrokenBarrierError, BrokenProcessPool, TimeoutError
            self._stop_pool(grace_s=0.0)
            return f"worker pool failed to start: {describe(err)}"
        return None

    def _stop_pool(self, grace_s: float) -> None:
        """Shut the pool down; workers still busy after `grace_s` are terminated, then killed."""
        pool, self._pool, self._pool_modules = self._pool, None, ()
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM ends a pure-Python hang at once
        for process in processes:
            process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)  # SIGKILL cannot be ignored; a loaded machine may take a moment to reap
