"""One completion's runner as the trainer sees it: its pipes, read under a cap, and its tear-down.

The runner is either a process tree of its own (a one-shot start of the backend) or a worker that a
pre-warmed server (`server.RunnerServer`) forked for this session. Either way the trainer creates
the four pipes, so reading, the output cap and the deadlines are the same code; only how the end
is noticed (a pidfd, or the server's `exit` record) and how it is forced differ.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpo_cli.rewards.code import backends
from grpo_cli.rewards.code.faults import HarnessFault
from grpo_cli.rewards.code.runner import processes, wire

if TYPE_CHECKING:
    from grpo_cli.rewards.code.server import RunnerServer

logger = logging.getLogger("grpo.sandbox")

CLOSE_GRACE_S = 1.0  # an honest runner exits within milliseconds of its job pipe closing
SUPERVISOR_GRACE_S = 2.0  # `process` backend: time for the supervisor to kill what the candidate left
REAP_WAIT_S = 5.0  # after SIGKILL: the kernel empties a PID namespace before its init is gone
POLL_S = 0.02  # exit polling where pidfd_open is unavailable
READ_CHUNK = 65536


class Deadline(Exception):
    """The session's wall clock ran out."""


class Flood(Exception):
    """The runner wrote more than the output cap."""


def pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernels before 5.3, or a seccomp filter that forbids it
        return None


def _wait_readable(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout)


def kill_tree(pid: int, backend: str, wait_exit: Callable[[float], bool]) -> None:
    """Stop the process tree a backend started at `pid` (a runner, or bwrap/unshare around one).
    `wait_exit(seconds)` waits for `pid` to end and says whether it did."""
    if backend == "process":  # the supervisor (root) kills the candidate's tree, setsid daemons included
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            if wait_exit(SUPERVISOR_GRACE_S):
                return
        logger.warning("sandbox supervisor %d ignored SIGTERM; killing its process group", pid)
    inner = [(child, pidfd(child)) for child in processes.children_of(pid)]  # the namespace's init
    for child, fd in inner:
        with contextlib.suppress(OSError):
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(child, signal.SIGKILL)
    if inner:  # bwrap/unshare reap their child and exit: no zombie is left to the host's init
        wait_exit(REAP_WAIT_S)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    for child, fd in inner:  # the init is gone only after the kernel killed everything in its namespace
        if fd is not None:
            _wait_readable(fd, REAP_WAIT_S)
            os.close(fd)
        else:
            end = time.monotonic() + REAP_WAIT_S
            while os.path.exists(f"/proc/{child}") and time.monotonic() < end:
                time.sleep(POLL_S)


class Child:
    """One runner: start it, feed its job pipe, read its pipes under a cap, tear it down.

    With `server`, the runner is a worker that server forks; `release(server)` hands the server
    back once this session is over (to be reused, or retired if anything went wrong).
    """

    def __init__(
        self,
        runtime: backends.Runtime,
        work_root: str,
        job: dict,
        cap: int,
        close_stdin_when_sent: bool = False,
        server: RunnerServer | None = None,
        release: Callable[[RunnerServer], None] | None = None,
    ) -> None:
        self.backend = runtime.backend
        self.cap = cap
        self.received = 0
        self.flooded = False  # past the cap: Flood was raised once; later output is read and dropped
        self.buffers = {"proto": bytearray(), "stdout": bytearray(), "stderr": bytearray()}
        self.open_streams: set[str] = set()
        self.outbox = bytearray()
        self.close_stdin_when_sent = close_stdin_when_sent
        self.exited = False
        self.returncode: int | None = None
        self.closed = False
        self._closing = False
        self.pidfd: int | None = None
        self.proc: subprocess.Popen | None = None
        self.server = server
        self._release = release
        self.session_id = 0
        self.selector = selectors.DefaultSelector()
        self._stdin_registered = False
        self._ours: list[int] = []  # our ends of the four pipes, closed at the end
        self.job_fd = -1
        self.workdir = ""  # _finish reads it, should the work dir fail
        self.workdir = self._make_workdir(server.dir if server is not None else work_root)
        job_r, self.job_fd = os.pipe()
        proto_r, proto_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._ours = [self.job_fd, proto_r, out_r, err_r]
        header = self._start(runtime, [job_r, proto_w, out_w, err_w])
        self._watch({"proto": proto_r, "stdout": out_r, "stderr": err_r})
        self.send(wire.frame({**job, **header}))

    # ---- start ---------------------------------------------------------------------------
    def _make_workdir(self, root: str) -> str:
        try:
            return backends.make_workdir(root)
        except OSError as err:
            self._finish()
            raise HarnessFault(f"cannot create a sandbox work dir: {err}") from err

    def _start(self, runtime: backends.Runtime, theirs: list[int]) -> dict:
        """Start the runner on its ends of the pipes (job, protocol, stdout, stderr), a worker of the
        server or a process tree of the backend, and close those ends here; the header its job carries.
        A failure to start tears everything down first."""
        job_r, proto_w, out_w, err_w = theirs
        try:
            if self.server is not None:
                self.session_id, header = self.server.start(self.workdir, theirs)
                return header
            spec = runtime.launch(self.workdir, proto_w)
            self.proc = subprocess.Popen(
                spec.argv,
                stdin=job_r,  # the job pipe, nothing else
                stdout=out_w,
                stderr=err_w,
                pass_fds=(proto_w,),  # the protocol pipe: records from the runner
                cwd=spec.cwd,
                env=dict(backends.ENV),  # never the trainer's environment
                start_new_session=True,  # its own process group, to kill as a whole
            )
            return spec.header
        except OSError as err:
            self.close(graceful=False)
            raise HarnessFault(f"cannot start the {self.backend} sandbox: {err}") from err
        except BaseException:
            self.close(graceful=False)
            raise
        finally:
            for fd in theirs:
                os.close(fd)

    def _watch(self, reads: dict[str, int]) -> None:
        """What the selector waits on: the pipes the runner writes, the job pipe once there is
        something to send (non-blocking), and how its end shows (the server's records, or a pidfd)."""
        if self.proc is not None:
            self.pidfd = pidfd(self.proc.pid)
        for name, fd in reads.items():
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, name)
            self.open_streams.add(name)
        os.set_blocking(self.job_fd, False)
        if self.server is not None:
            self.selector.register(self.server.fileno(), selectors.EVENT_READ, "server")
        elif self.pidfd is not None:
            self.selector.register(self.pidfd, selectors.EVENT_READ, "exit")

    # ---- pipes ---------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.job_fd < 0:
            return
        self.outbox += data
        if not self._stdin_registered:
            self.selector.register(self.job_fd, selectors.EVENT_WRITE, "stdin")
            self._stdin_registered = True

    def _close_stdin(self) -> None:
        if self._stdin_registered:
            self.selector.unregister(self.job_fd)
            self._stdin_registered = False
        self.outbox.clear()
        if self.job_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.job_fd)
            self._ours.remove(self.job_fd)
            self.job_fd = -1

    def _handle(self, name: str, fd: int) -> None:
        if name == "stdin":
            try:
                written = os.write(fd, self.outbox[:READ_CHUNK])
            except BlockingIOError:
                return
            except OSError:  # the runner is gone; its death shows up as EOF on the protocol pipe
                written = len(self.outbox)
            del self.outbox[:written]
            if not self.outbox:
                self.selector.unregister(fd)
                self._stdin_registered = False
                if self.close_stdin_when_sent:
                    self._close_stdin()
            return
        if name == "exit":
            self.exited = True
            self.selector.unregister(fd)
            return
        if name == "server":
            ended, status = self.server.poll(self.session_id)
            if ended:
                self.exited, self.returncode = True, status
                self.selector.unregister(fd)
            return
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self.selector.unregister(fd)
            self.open_streams.discard(name)
            return
        if self.flooded:
            return
        self.received += len(chunk)
        if self.received > self.cap:
            self.flooded = True
            raise Flood()
        self.buffers[name] += chunk

    def _poll_exit(self) -> None:
        if self.proc is not None and self.pidfd is None and not self.exited:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            self.exited = info is not None and info.si_pid != 0

    def pump(self, until: Callable[[], bool], deadline: float) -> None:
        """Move bytes both ways until `until()`; Deadline at `deadline`, Flood past the output cap."""
        polled = self.proc is not None and self.pidfd is None
        while not until() and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Deadline()
            if not self.selector.get_map():
                time.sleep(min(remaining, POLL_S))
            for key, _ in self.selector.select(min(remaining, POLL_S) if polled else remaining):
                self._handle(key.data, key.fd)
            self._poll_exit()

    def drain(self) -> None:
        """Take in whatever is ready now, without waiting."""
        while not self.closed:
            events = self.selector.select(0) if self.selector.get_map() else []
            reads = [(key, mask) for key, mask in events if key.data != "stdin"]
            if not reads:
                break
            for key, _ in reads:
                self._handle(key.data, key.fd)
        if not self.closed:
            self._poll_exit()

    def next_record(self, deadline: float) -> Any:
        """The next protocol line, parsed; None once the runner is gone. ValueError if not JSON."""
        self.pump(lambda: b"\n" in self.buffers["proto"] or "proto" not in self.open_streams, deadline)
        line, found, rest = bytes(self.buffers["proto"]).partition(b"\n")
        if not found:
            return None
        self.buffers["proto"] = bytearray(rest)
        return json.loads(line)

    def stderr_tail(self, limit: int = 300) -> str:
        text = self.buffers["stderr"][-limit:].decode(errors="replace").strip()
        return f": {text}" if text else ""

    # ---- tear-down -----------------------------------------------------------------------
    def _wait_exited(self, seconds: float) -> bool:
        with contextlib.suppress(Deadline, Flood):
            self.pump(lambda: self.exited, time.monotonic() + seconds)
        return self.exited

    def close(self, graceful: bool) -> None:
        """Stop the runner and everything it started (politely first if `graceful`), reap it,
        delete the work dir, hand a server back."""
        if self.closed or self._closing:
            return
        self._closing = True
        try:
            if self.proc is not None or self.session_id:
                if graceful and not self.exited:
                    self._close_stdin()  # EOF on the job pipe: the runner exits, taking its tree with it
                    self._wait_exited(CLOSE_GRACE_S)
                if not self.exited:
                    self._kill()
                if self.proc is not None:
                    with contextlib.suppress(OSError):  # stragglers in its group; the leader is unreaped, the id ours
                        os.killpg(self.proc.pid, signal.SIGKILL)
                with contextlib.suppress(Flood):
                    self.drain()
                if self.proc is not None:
                    try:
                        self.proc.wait(REAP_WAIT_S)
                        self.returncode = self.proc.returncode
                    except subprocess.TimeoutExpired:  # unkillable (uninterruptible I/O): leave it, do not hang
                        logger.error("sandbox process %d did not die after SIGKILL", self.proc.pid)
        finally:
            self._finish()

    def _kill(self) -> None:
        if self.server is None:
            kill_tree(self.proc.pid, self.backend, self._wait_exited)
            return
        self.server.kill(self.session_id)  # the server kills the worker and everything it started
        if not self._wait_exited(REAP_WAIT_S):
            logger.warning("pre-warmed sandbox runner did not end session %d; killing the runner", self.session_id)
            self.server.terminate()
            self.exited = True

    def _finish(self) -> None:
        self.closed = True
        self.selector.close()
        for fd in [*self._ours, self.pidfd]:
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._ours = []
        self.job_fd = -1
        if self.workdir:
            try:
                backends.remove_workdir(self.workdir)
            except Exception as err:  # a full disk or a hung `rm` must not take the trainer down
                logger.error("could not remove sandbox work dir %s: %s", self.workdir, err)
        server, self.server = self.server, None
        if server is not None and self._release is not None:
            if not self.exited and self.session_id:
                server.terminate()  # never hand on a server whose session may still run
            self._release(server)
