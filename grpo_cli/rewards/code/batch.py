"""One batch of sandboxed scoring jobs: the process's sandboxes, built on first use and cached
per distinct set of settings, and a batch's jobs run under one wall-clock deadline.
Importing this module starts nothing."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from grpo_cli.bounded_calls import DONE, RAISED, run_bounded
from grpo_cli.config.schema import SandboxConfig
from grpo_cli.rewards.code.faults import HarnessFault
from grpo_cli.rewards.code.sandbox import Sandbox

BATCH_TIMEOUT_S = 50.0  # a batch's wall clock for code_tests; below the executor's 60 s default watchdog

logger = logging.getLogger("grpo.sandbox")
_SANDBOXES: dict[tuple[Any, ...], Sandbox] = {}  # sandbox settings -> Sandbox, one per process
_SANDBOX_LOCK = threading.Lock()


def sandbox_for(**settings: Any) -> Sandbox:
    """The process's Sandbox for these settings (the `SandboxConfig` fields among them, the
    `sandbox.*` defaults for the rest; data columns and other kwargs are ignored). Probing the
    backend happens once, here."""
    names = [f.name for f in dataclasses.fields(SandboxConfig)]
    config = SandboxConfig(**{name: settings[name] for name in names if name in settings})
    key = dataclasses.astuple(config)
    with _SANDBOX_LOCK:
        sandbox = _SANDBOXES.get(key)
        if sandbox is None:
            sandbox = _SANDBOXES[key] = Sandbox(config)  # a HarnessFault here is not cached: retried next batch
    return sandbox


def sandbox_backend(**settings: Any) -> str:
    """The backend the sandbox with these settings runs on (bwrap, unshare or process), for
    diagnostics; builds that sandbox if this process has none yet."""
    return sandbox_for(**settings).backend


@atexit.register
def close_sandboxes() -> None:
    """Close every cached sandbox (also at interpreter exit)."""
    with _SANDBOX_LOCK:
        sandboxes = list(_SANDBOXES.values())
        _SANDBOXES.clear()
    for sandbox in sandboxes:
        sandbox.close()


def run_batch(jobs: dict[int, Callable[[], float | None]], workers: int, deadline_s: float) -> dict[int, Any]:
    """Run the jobs on at most `workers` threads (each sandbox session is its own process) until
    the deadline, through the runner env=code_feedback's steps use (`grpo_cli.bounded_calls`). A job
    still running then scores 0 (it was slow), and so does one never started: the time went to its
    batch's slow candidates, and a None would drop code_tests from that completion's fused mean
    only, so a wrong answer queued behind hangs would outscore them. A job that raises (our bug:
    whatever the candidate causes is a verdict) leaves its own row unscored (None), said in the
    log, and never another row: one completion cannot void its batch."""
    indices = list(jobs)
    outcomes = run_bounded([jobs[i] for i in indices], workers, deadline_s=deadline_s, name="code-tests")
    results: dict[int, Any] = {}
    for i, outcome in zip(indices, outcomes):
        if outcome.state == RAISED:
            logger.error("code tests: row %d left unscored: %r", i, outcome.error, exc_info=outcome.error)
        results[i] = outcome.value if outcome.state in (DONE, RAISED) else 0.0  # never None for slowness
    return results


def settings_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    """The sandbox settings among a reward's kwargs, as a key for what is memoised per sandbox."""
    return tuple(settings.get(f.name) for f in dataclasses.fields(SandboxConfig))


def score_jobs(
    scores: list[float | None],
    jobs: dict[int, Callable[[Any], float | None]],
    settings: dict[str, Any],
    deadline_s: float,
) -> list[float | None]:
    """Fill `scores` from `jobs`, each called with the sandbox built from `settings`; all unscored
    (None) if the sandbox cannot start."""
    if not jobs:
        return scores
    try:
        sandbox = sandbox_for(**settings)
    except HarnessFault:
        return scores  # the sandbox cannot start: every sample that needed it is unscored (None)
    # No more sessions at once than the sandbox's workers: RLIMIT_NPROC is shared by all of them.
    bound = {i: functools.partial(job, sandbox) for i, job in jobs.items()}
    for index, value in run_batch(bound, sandbox.workers, deadline_s).items():
        scores[index] = value
    return scores
