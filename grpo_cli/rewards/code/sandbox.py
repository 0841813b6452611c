"""Run model-written code without trusting it: one fresh sandboxed process per completion (docs/architecture.md §5).

    sandbox = Sandbox(SandboxConfig(timeout_s=5))
    with sandbox.session(source, "add") as s:   # a fresh process; the candidate is imported as nobody
        assert s.call(1, 2) == 3                 # inputs go in, strict builtin values come out
    result = sandbox.run_program(source, stdin="1 2\\n")   # stdin/stdout tasks: compare result.stdout
    sandbox.close()

The parent decides. The child only ever receives inputs; whatever it returns is decoded here into
exact builtin types, so an object whose `__eq__` always says yes cannot reach a comparison. Exit
codes, stdout markers and anything the child claims about itself are ignored. Anything the
candidate causes raises CandidateFailure (score 0); only a failing harness raises HarnessFault
(score None), so crashing the sandbox never takes a completion out of the loss.

No fork and no preexec_fn here (the trainer may hold CUDA state and threads): `subprocess` execs the
backend at once, and the runner sets its own rlimits and drops privileges inside. By default that
runner is pre-warmed (`server.py`): started once per worker, it forks a fresh worker for each
completion and kills everything the completion started before the next one; `prewarm=False`
starts the whole backend per completion instead (one namespace per completion, 30-40 ms each).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from grpo_cli.config.schema import SandboxConfig
from grpo_cli.rewards.code import backends
from grpo_cli.rewards.code.child import Child, Deadline, Flood
from grpo_cli.rewards.code.faults import CandidateFailure, HarnessFault
from grpo_cli.rewards.code.runner import wire
from grpo_cli.rewards.code.server import ServerPool

logger = logging.getLogger("grpo.sandbox")

BACKENDS = ("auto", "bwrap", "unshare", "process")
T = TypeVar("T")
R = TypeVar("R")


# Fixed limits, not settings: generous for any honest completion, small enough that a hostile one
# costs nothing. Over MAX_OUTPUT_BYTES read from a session's pipes is a flood (killed, scores 0);
# a source over MAX_SOURCE_BYTES scores 0 without running.
MAX_OUTPUT_BYTES = 1_000_000
MAX_SOURCE_BYTES = 100_000
PRINTED_BYTES = 2_000  # of a session's stdout, kept for feedback


@dataclass(frozen=True)
class ProgramResult:
    """What a stdin/stdout program produced. Compare `stdout`; `exit_code` is the candidate's word only."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when it was killed at the deadline
    timed_out: bool
    cost: int | None = None  # bytecode instructions executed, when counted and reported (untrusted)


def _source_too_long(source: str, limit: int) -> bool:
    return len(source) > limit or len(source.encode("utf-8", "surrogatepass")) > limit


class Session:
    """One completion's sandboxed process: `call(*args, **kwargs)` runs the entry point on those inputs.

    Results come back as exact builtin values (int, float, str, bool, None, bytes, and lists,
    tuples, dicts, sets of them). A candidate exception raises CandidateFailure(kind="raised") and
    the session goes on; anything else (timeout, crash, flood, protocol or non-plain results) ends
    it: `failure` keeps that first fatal CandidateFailure and every later call raises it again, so a
    check that swallows exceptions cannot turn a dead session into a pass.

    `setup` (trusted task code, e.g. MBPP's test_setup_code) runs in the candidate's module first.
    With `count`, each call also reports the bytecode instructions it executed; `cost` sums them.
    The count comes from the candidate's own process: a measure for honest code, not a proof.
    """

    def __init__(
        self, sandbox: Sandbox, source: str, entry_point: str | None, setup: str = "", count: bool = False
    ) -> None:
        self.entry_point = entry_point
        self.failure: CandidateFailure | None = None
        self.count = count
        self.cost = 0
        self._sandbox = sandbox
        self._timeout_s = sandbox.cfg.timeout_s
        self._deadline = time.monotonic() + sandbox.cfg.timeout_s
        self._next_id = 0
        self._child: Child | None = None
        self.printed = ""  # after close: the tail of what the candidate wrote to stdout (env=code_feedback)
        if _source_too_long(source, MAX_SOURCE_BYTES):
            raise self._fail("too_large", f"source over {MAX_SOURCE_BYTES} bytes: not run")
        job = {"mode": "call", "source": source, "entry_point": entry_point, "setup": setup, **sandbox._job_fields()}
        self._child = sandbox._spawn(job)
        try:
            _check_hello(sandbox, self._child, self._deadline)
            ready = self._record(0)
            if "error" in ready:
                kind = ready.get("kind") if ready.get("kind") in ("syntax", "missing", "raised") else "protocol"
                error, exc_type = _text(ready.get("error")), _text(ready.get("exc_type")) or None
                raise self._fail(kind, error, exc_type, _text(ready.get("trace"), 800))
            if ready != {"id": 0, "ok": None}:
                raise self._fail("protocol", "malformed ready record")
        except BaseException:
            self.close()
            raise

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """The entry point called on these (plain builtin) inputs."""
        try:
            wire.encode([args, kwargs])  # only exact builtin types travel (and marshal could carry code)
        except (ValueError, RecursionError) as err:
            raise HarnessFault(f"test inputs must be plain builtin values: {err}") from None
        return self._request({"args": args, "kwargs": kwargs})

    def evaluate(self, expression: str) -> Any:
        """A call written by the trusted test (say `f([Pair(1, 2)], 1)`), evaluated in the candidate's
        module, where the set-up code's classes exist: its arguments need not be plain values."""
        return self._request({"expr": str(expression)})

    def _request(self, fields: dict) -> Any:
        if self.failure is not None:
            raise CandidateFailure(str(self.failure), self.failure.kind, self.failure.exc_type)
        if self.entry_point is None:
            raise HarnessFault("this session has no entry point to call")
        if self._child is None or self._child.closed:
            raise HarnessFault("the session is closed")
        self._next_id += 1
        request = wire.frame({"id": self._next_id, "count": self.count, **fields})
        try:
            self._child.drain()
        except Flood:
            raise self._fail("output_flood", f"more than {self._child.cap} bytes of output") from None
        if self._child.buffers["proto"]:
            raise self._fail("protocol", "a record arrived that nobody asked for")
        self._child.send(request)
        record = self._record(self._next_id)
        if "error" in record:
            message, exc_type = _text(record.get("error")), _text(record.get("exc_type")) or None
            if record.get("kind") == "raised":
                raise CandidateFailure(message, "raised", exc_type, _text(record.get("trace"), 800))
            raise self._fail("non_strict", message)
        if set(record) != ({"id", "ok", "cost"} if self.count else {"id", "ok"}):
            raise self._fail("protocol", "malformed response record")
        if self.count:
            if type(record["cost"]) is not int or record["cost"] < 0:
                raise self._fail("protocol", "malformed instruction count")
            self.cost += record["cost"]
        try:
            return wire.decode(record["ok"])
        except (ValueError, RecursionError) as err:
            raise self._fail("protocol", f"malformed value: {err}") from None

    def close(self) -> CandidateFailure | None:
        """End the process tree. Returns a failure for records that arrived unasked (a forged verdict)."""
        child, self._child = self._child, None
        if child is None:
            return None
        healthy = self.failure is None and not child.closed
        child.close(graceful=healthy)  # a graceful close reads the pipes until the runner is gone
        self.printed = bytes(child.buffers["stdout"][-PRINTED_BYTES:]).decode(errors="replace")
        self._sandbox._forget(child)
        if healthy and child.buffers["proto"]:
            return self._fail("protocol", "a record arrived that nobody asked for")
        return None

    def _record(self, expected_id: int) -> dict:
        child = self._child
        try:
            record = child.next_record(self._deadline)
        except Deadline:
            raise self._fail("timeout", f"no answer within the session's {self._timeout_s}s") from None
        except Flood:
            raise self._fail("output_flood", f"more than {child.cap} bytes of output") from None
        except (ValueError, RecursionError):
            raise self._fail("protocol", "a malformed record") from None
        if record is None:
            raise self._fail("crashed", f"the sandboxed process ended{child.stderr_tail()}")
        if type(record) is not dict or type(record.get("id")) is not int or record["id"] != expected_id:
            raise self._fail("protocol", f"expected record {expected_id}, got another")
        if child.buffers["proto"]:
            raise self._fail("protocol", "more than one record for one request")
        return record

    def _fail(self, kind: str, message: str, exc_type: str | None = None, trace: str = "") -> CandidateFailure:
        err = CandidateFailure(message, kind, exc_type, trace)
        if self.failure is None:
            self.failure = err
        if self._child is not None:
            self._child.close(graceful=False)
        return err


def _program_cost(proto: bytes) -> int | None:
    """The one `{"id": 1, "cost": N}` record a counted script's runner writes after it; None for
    anything else (the script died first, or wrote records of its own)."""
    try:
        record = json.loads(bytes(proto))
    except ValueError:
        return None
    if type(record) is dict and set(record) == {"id", "cost"} and record["id"] == 1:
        cost = record["cost"]
        return cost if type(cost) is int and cost >= 0 else None
    return None


def _clean_up(live: set[Child], servers: list[ServerPool], root: str) -> None:
    for child in list(live):
        child.close(graceful=False)
    for pool in servers:
        pool.close()
    shutil.rmtree(root, ignore_errors=True)


def _text(value: Any, limit: int = 500) -> str:
    return value[:limit] if type(value) is str else ""


def _check_hello(sandbox: Sandbox, child: Child, deadline: float) -> None:
    """The runner's first record comes before any candidate code: its absence is the harness's fault."""
    try:
        hello = child.next_record(deadline)
    except (Deadline, Flood, ValueError, RecursionError) as err:
        child.close(graceful=False)
        raise HarnessFault(f"the {sandbox.backend} sandbox did not start ({type(err).__name__})") from None
    want = backends.NOBODY if backends.running_as_root() else None
    if type(hello) is not dict or hello.get("id") != -1 or (want is not None and hello.get("uid") != want):
        child.close(graceful=False)
        raise HarnessFault(f"the {sandbox.backend} sandbox did not start{child.stderr_tail()}")


class Sandbox:
    """Start-up: pick and probe the backend once. Then `session`, `run_program`, `run_many`, `close`."""

    def __init__(self, cfg: SandboxConfig | None = None, *, _probe_order: Sequence[str] | None = None) -> None:
        self.cfg = cfg = cfg or SandboxConfig()
        if cfg.backend not in BACKENDS:
            raise ValueError(f"sandbox.backend must be one of {', '.join(BACKENDS)}, not {cfg.backend!r}")
        if cfg.timeout_s <= 0 or cfg.memory_mb < 32 or cfg.workers < 1:
            raise ValueError("sandbox: timeout_s must be > 0, memory_mb >= 32 and workers >= 1")
        self.workers = min(cfg.workers, os.cpu_count() or 1)
        self._lock = threading.Lock()
        self._live: set[Child] = set()
        self._pool: ThreadPoolExecutor | None = None
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
        if _source_too_long(source, MAX_SOURCE_BYTES):
            raise CandidateFailure(f"source over {MAX_SOURCE_BYTES} bytes: not run", "too_large")
        deadline = time.monotonic() + self.cfg.timeout_s
        job = {"mode": "program", "source": source, "entry_point": None, "stdin": stdin, "count": count}
        job.update(self._job_fields())
        child = self._spawn(job, close_stdin_when_sent=True)
        timed_out = False
        try:
            _check_hello(self, child, deadline)
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
            cost=_program_cost(child.buffers["proto"]) if count and not timed_out else None,
        )

    def run_many(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`[fn(item) for item in items]` on up to `workers` threads, each free to open sessions.
        Exceptions from `fn` propagate: catch CandidateFailure inside `fn`."""
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="grpo-sandbox")
            pool = self._pool
        return list(pool.map(fn, items))

    def close(self) -> None:
        """Kill live sessions, stop the pool, remove the temp root."""
        with self._lock:
            pool, self._pool = self._pool, None
            live = list(self._live)
            self._live.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        for child in live:
            child.close(graceful=False)
        self._finalizer()  # removes the temp root

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
