"""One completion's sandboxed process (`Session`), and what a stdin/stdout program produced
(`ProgramResult`): the parent's side of the protocol, which decodes whatever the child sends as
untrusted (docs/architecture.md §5). `Sandbox` (sandbox.py) starts the processes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo_cli.rewards.code import backends
from grpo_cli.rewards.code.child import Child, Deadline, Flood
from grpo_cli.rewards.code.faults import CandidateFailure, HarnessFault
from grpo_cli.rewards.code.runner import wire

if TYPE_CHECKING:
    from grpo_cli.rewards.code.sandbox import Sandbox

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


def source_too_long(source: str, limit: int) -> bool:
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
        if source_too_long(source, MAX_SOURCE_BYTES):
            raise self._fail("too_large", f"source over {MAX_SOURCE_BYTES} bytes: not run")
        job = {"mode": "call", "source": source, "entry_point": entry_point, "setup": setup, **sandbox._job_fields()}
        self._child = sandbox._spawn(job)
        try:
            check_hello(sandbox, self._child, self._deadline)
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


def program_cost(proto: bytes) -> int | None:
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


def _text(value: Any, limit: int = 500) -> str:
    return value[:limit] if type(value) is str else ""


def check_hello(sandbox: Sandbox, child: Child, deadline: float) -> None:
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
