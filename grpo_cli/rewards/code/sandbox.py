"""Run model-written code without trusting it: one fresh sandboxed process per completion (docs/architecture.md §5).

    sandbox = Sandbox(SandboxConfig(timeout_s=5))
    with sandbox.session(source, "add") as s:   # a fresh process; the candidate is imported as nobody
        assert s.call(1, 2) == 3                 # inputs go in, strict builtin values come out
    result = sandbox.run_program(source, stdin="1 2\\n")   # stdin/stdout tasks: compare result.stdout
    sandbox.close()

The parent decides. The child only ever receives inputs; whatever it returns is decoded here into
exact builtin types (`session.py`: the parent's side of one session), so an object whose `__eq__`
always says yes cannot reach a comparison. Exit codes, stdout markers and anything the child
claims about itself are ignored. Anything the candidate causes raises CandidateFailure (score 0);
only a failing harness raises HarnessFault (score None), so crashing the sandbox never takes a
completion out of the loss.

No fork and no preexec_fn here (the trainer may hold CUDA state and threads): `subprocess` execs the
backend at once, and the runner sets its own rlimits and drops privileges inside. By default that
runner is pre-warmed (`server.py`): started once per worker, it forks a fresh worker for each
completion and kills everything the completion started before the next one; `prewarm=False`
starts the whole backend per completion instead (one namespace per completion, 30-40 ms each).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from grpo_cli.bounded_calls import RAISED, run_bounded
from grpo_cli.config.schema import SandboxConfig
from grpo_cli.rewards.code import backends
from grpo_cli.rewards.code.child import Child, Deadline, Flood
from grpo_cli.rewards.code.faults import CandidateFailure, HarnessFault
from grpo_cli.rewards.code.server import ServerPool
from grpo_cli.rewards.code.session import (
    MAX_OUTPUT_BYTES,
    MAX_SOURCE_BYTES,
    PRINTED_BYTES,
    ProgramResult,
    Session,
    check_hello,
    program_cost,
    source_too_long,
)

__all__ = ["MAX_OUTPUT_BYTES", "MAX_SOURCE_BYTES", "PRINTED_BYTES", "CandidateFailure", "HarnessFault"]
__all__ += ["ProgramResult", "Sandbox", "SandboxConfig", "Session", "session_workers"]
logger = logging.getLogger("grpo.sandbox")

BACKENDS = ("auto", "bwrap", "unshare", "process")
T = TypeVar("T")
R = TypeVar("R")


def session_workers(cfg: SandboxConfig) -> int:
    """Sessions a sandbox runs at once: `sandbox.workers`, at most the cores (RLIMIT_NPROC is
    shared by all of them). code_tests and env=code_feedback both keep to it."""
    return max(1, min(cfg.workers, os.cpu_count() or 1))


def _clean_up(live: set[Child], servers: list[ServerPool], root: str) -> None:
    for child in list(live):
        child.close(graceful=False)
    for pool in servers:
        pool.close()
    shutil.rmtree(root, ignore_errors=True)


class Sandbox:
    """Start-up: pick and probe the backend once. Then `session`, `run_program`, `run_many`, `close`."""

    def __init__(self, cfg: SandboxConfig | None = None, *, _probe_order: Sequence[str] | None = None) -> None:
        self.cfg = cfg = cfg or SandboxConfig()
        if cfg.backend not in BACKENDS:
            raise ValueError(f"sandbox.backend must be one of {', '.join(BACKENDS)}, not {cfg.backend!r}")
        if cfg.timeout_s <= 0 or cfg.memory_mb < 32 or cfg.workers < 1:
            raise ValueError("sandbox: timeout_s must be > 0, memory_mb >= 32 and workers >= 1")
        self.workers = session_workers(cfg)
        self._lock = threading.Lock()
        self._live: set[Child] = set()
        self.most_at_once = 0  # the most sessions alive at once so far: what `workers` bounds
        self._servers: list[ServerPool] = []  # the pre-warmed runners, once the backend is known
        self.root = tempfile.mkdtemp(prefix="grpo-sandbox-")
        self.tag = os.path.basename(self.root)  # on every sandboxed command line: `ps aux | grep TAG`
        # Also at interpreter exit:
        self._finalizer = weakref.finalize(self, _clean_up, self._live, self._servers, self.root)
        os.chmod(self.root, 0o711)  # nobody may pass through to its own work dir, not list the others
        self.runner_path = backends.install_runner(self.root)
        self.work_root = os.path.join(self.root, "work")  # one-shot sessions and probes
        os.mkdir(self.work_root, 0o711)
        self.server_root = os.path.join(self.root, "servers")  # one dir per pre-warmed runner
        os.mkdir(self.server_root, 0o711)
        self.probe_failures: list[str] = []
        try:
            self.backend, self.python = self._choose(_probe_order)
            self.runtime = backends.Runtime(self.backend, self._interpreter, self.runner_path, self.tag)
            self.prewarm = cfg.prewarm and self._start_servers()
        except BaseException:
            self.close()
            raise

    # ---- start-up ------------------------------------------------------------------------
    def _choose(self, probe_order: Sequence[str] | None) -> tuple[str, str]:
        cfg = self.cfg
        order = tuple(probe_order or backends.PROBE_ORDER) if cfg.backend == "auto" else (cfg.backend,)
        if cfg.require_isolation:
            if not any(name in backends.NAMESPACED for name in order):
                raise HarnessFault("sandbox.require_isolation=true but sandbox.backend=process has no namespaces")
            order = tuple(name for name in order if name in backends.NAMESPACED)
        pythons = backends.interpreters()
        if not pythons:
            raise HarnessFault("no Python interpreter (>= 3.8) found to run the sandbox")
        for name in order:
            failures = []
            for python in pythons:
                error = backends.probe(name, python, self.runner_path, self.work_root)
                if error is None:
                    if failures:
                        logger.info("code sandbox: %s runs %s (%s)", name, python.path, "; ".join(failures))
                    self._interpreter = python
                    self._report(name)
                    return name, python.path
                failures.append(error)
                if error.endswith("is not installed"):
                    break
            self.probe_failures += failures
        tried = "; ".join(self.probe_failures)
        if cfg.require_isolation:
            raise HarnessFault(
                f"sandbox.require_isolation=true and no namespace backend works ({tried}). "
                "Install bubblewrap (apt-get install bubblewrap) or enable user namespaces for unshare."
            )
        raise HarnessFault(
            f"no sandbox backend works ({tried}). The runner drops to uid {backends.NOBODY}: the interpreter "
            "and its standard library must be readable by that user (not under a 0700 home such as /root)."
        )

    def _report(self, name: str) -> None:
        if name == "process":
            exposed = (
                "it runs as YOUR user (the trainer is not root, so it cannot drop privileges) and can read, "
                "change and delete your files and signal your processes"
                if not backends.running_as_root()
                else f"it runs as uid {backends.NOBODY} and can read every world-readable file, write to "
                "world-writable directories (/tmp, /dev/shm), see other processes and signal every process of "
                "that uid, including the sessions of other completions running at the same time"
            )
            tried = f" Probes that failed: {'; '.join(self.probe_failures)}." if self.probe_failures else ""
            logger.warning(
                "code sandbox WITHOUT isolation (backend=process): model-written code can reach the network, %s. "
                "Install bubblewrap (apt-get install bubblewrap) or make `unshare` work (util-linux, user "
                "namespaces), or set sandbox.require_isolation=true to refuse to run like this.%s",
                exposed,
                tried,
            )
        elif name == "unshare":
            logger.info(
                "code sandbox: backend=unshare (private network, PID and /tmp; the host filesystem stays "
                "readable to uid %d). bubblewrap adds a private filesystem view.",
                backends.NOBODY,
            )

    def _start_servers(self) -> bool:
        """Start the first pre-warmed runner now. If this backend cannot run one here, fall back to
        a fresh backend per completion (slower, as safe) and say so."""
        pool = ServerPool(self.runtime, self.server_root)
        try:
            pool.warm()
        except HarnessFault as err:
            pool.close()
            logger.warning("code sandbox: no pre-warmed runner (%s); starting %s per completion", err, self.backend)
            return False
        self._servers.append(pool)
        return True

    def server_pids(self) -> set[int]:
        """Host process ids of the idle and busy pre-warmed runners (not of any session)."""
        return self._servers[0].pids() if self._servers else set()

    def stop_idle_runners(self) -> None:
        """Stop the pre-warmed runners no session is using (say, before a long evaluation without
        code); the next session starts one again."""
        if self._servers:
            self._servers[0].stop_idle()

    def _job_fields(self) -> dict:
        cfg = self.cfg
        return {
            "limits": backends.limits(cfg.memory_mb, cfg.timeout_s, self.workers),
            "max_record_bytes": MAX_OUTPUT_BYTES,
        }

    def _spawn(self, job: dict, close_stdin_when_sent: bool = False) -> Child:
        cap = MAX_OUTPUT_BYTES
        if self.prewarm and self._servers:
            pool = self._servers[0]
            server = pool.acquire()
            child = Child(self.runtime, self.work_root, job, cap, close_stdin_when_sent, server, pool.release)
        else:
            child = Child(self.runtime, self.work_root, job, cap, close_stdin_when_sent)
        with self._lock:
            self._live.add(child)
            self.most_at_once = max(self.most_at_once, len(self._live))
        return child

    def _forget(self, child: Child) -> None:
        with self._lock:
            self._live.discard(child)

    # ---- running code --------------------------------------------------------------------
    @contextlib.contextmanager
    def session(self, source: str, entry_point: str | None, setup: str = "", count: bool = False) -> Iterator[Session]:
        """A fresh sandboxed process with `setup`, then `source`, imported (CandidateFailure if that
        fails); `count`: calls report the instructions they execute (Session.cost)."""
        session = Session(self, source, entry_point, setup, count)
        try:
            yield session
        except BaseException:
            session.close()
            raise
        late = session.close()
        if late is not None:
            raise late

    def run_program(self, source: str, stdin: str, count: bool = False) -> ProgramResult:
        """Run `source` as a script on `stdin`. CandidateFailure for an over-long source or an output
        flood; a timeout is reported in the result (timed_out=True). `count`: the result's `cost` is
        the bytecode instructions the script executed (None if it did not end normally)."""
        if source_too_long(source, MAX_SOURCE_BYTES):
            raise CandidateFailure(f"source over {MAX_SOURCE_BYTES} bytes: not run", "too_large")
        deadline = time.monotonic() + self.cfg.timeout_s
        job = {"mode": "program", "source": source, "entry_point": None, "stdin": stdin, "count": count}
        job.update(self._job_fields())
        child = self._spawn(job, close_stdin_when_sent=True)
        timed_out = False
        try:
            check_hello(self, child, deadline)
            child.pump(lambda: child.exited and not child.open_streams & {"stdout", "stderr"}, deadline)
        except Deadline:
            timed_out = True
        except Flood:
            raise CandidateFailure(f"more than {MAX_OUTPUT_BYTES} bytes of output", "output_flood") from None
        finally:
            child.close(graceful=False)
            self._forget(child)
        return ProgramResult(
            stdout=child.buffers["stdout"].decode(errors="replace"),
            stderr=child.buffers["stderr"].decode(errors="replace"),
            exit_code=None if timed_out else child.returncode,
            timed_out=timed_out,
            cost=program_cost(child.buffers["proto"]) if count and not timed_out else None,
        )

    def run_many(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`[fn(item) for item in items]` on up to `workers` threads, each free to open sessions.
        Exceptions from `fn` propagate: catch CandidateFailure inside `fn`."""
        outcomes = run_bounded([functools.partial(fn, item) for item in items], self.workers, name="grpo-sandbox")
        for outcome in outcomes:
            if outcome.state == RAISED:
                raise outcome.error  # type: ignore[misc]
        return [outcome.value for outcome in outcomes]

    def close(self) -> None:
        """Kill live sessions, remove the temp root."""
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for child in live:
            child.close(graceful=False)
        self._finalizer()  # removes the temp root

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
