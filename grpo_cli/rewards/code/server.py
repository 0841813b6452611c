"""Pre-warmed runners: a sandbox started once and asked to fork a fresh worker per completion.

Starting bwrap and a Python interpreter costs 30-40 ms, while a typical completion's calls take
well under a millisecond: start-up is most of a session. A `RunnerServer` pays it once. The
server (`runner.prewarmed.serve`, inside the same backend and namespaces a one-shot runner gets) forks one
worker per session, which applies the rlimits and drops to the unprivileged user exactly as a
one-shot runner does. Before it reports a session over, the server kills and reaps everything the
session started, and the trainer deletes everything in the server's directory; a server that cannot
promise a clean slate (SysV IPC objects left, a session it could not end, any protocol surprise)
is retired and the next session gets a fresh one.

The control channel is a SOCK_SEQPACKET socket pair: the trainer sends small marshal messages, with
the session's four pipe ends attached (SCM_RIGHTS); the server answers with one JSON record per
message, which the trainer parses as untrusted.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import marshal
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import threading
import time

from grpo_cli.rewards.code import backends
from grpo_cli.rewards.code.child import CLOSE_GRACE_S, REAP_WAIT_S, kill_tree
from grpo_cli.rewards.code.faults import HarnessFault
from grpo_cli.rewards.code.runner import processes, wire

logger = logging.getLogger("grpo.sandbox")

START_TIMEOUT_S = 30.0  # a cold start on a loaded machine (the same allowance as the start-up probe)
MAX_SESSIONS = 500  # a server retires after this many sessions: defence in depth against slow leaks
MAX_RECORD_BYTES = 4096


class RunnerServer:
    """One pre-warmed runner. Not thread-safe: a pool hands it to one session at a time."""

    def __init__(self, runtime: backends.Runtime, root: str) -> None:
        self.runtime = runtime
        self.sessions = 0
        self.broken = False
        self.closed = False
        self.proc: subprocess.Popen | None = None
        # Root-owned and not writable by the candidate's user: only its session dir is.
        self.dir = tempfile.mkdtemp(prefix="s-", dir=root)
        os.chmod(self.dir, 0o755)
        self.ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            spec = runtime.launch(self.dir, theirs.fileno(), serve=True)
            self.header = {key: value for key, value in spec.header.items() if key != "private_tmp"}
            self.proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,  # only the server's own start-up errors; workers get their own pipes
                pass_fds=(theirs.fileno(),),
                cwd=spec.cwd,
                env=dict(backends.ENV),
                start_new_session=True,
            )
        except OSError as err:
            self.close()
            raise HarnessFault(f"cannot start a pre-warmed {runtime.backend} runner: {err}") from err
        finally:
            theirs.close()
        try:
            setup = {
                "workdir": self.dir,
                "private_tmp": bool(spec.header.get("private_tmp")),
                "namespaced": runtime.backend in backends.NAMESPACED,
            }
            self._send(setup)
            hello = self._wait_for_record(START_TIMEOUT_S)
            if type(hello) is not dict or hello.get("id") != wire.HELLO_ID or type(hello.get("pid")) is not int:
                raise OSError(f"no hello{self._stderr_tail()}")
        except (OSError, ValueError) as err:
            self.terminate()
            self.close()
            raise HarnessFault(f"the pre-warmed {runtime.backend} runner did not start: {err}") from None
        self.ctrl.setblocking(False)

    # ---- the control channel -------------------------------------------------------------
    def fileno(self) -> int:
        return self.ctrl.fileno()

    def _send(self, message: dict, fds: list[int] | None = None) -> None:
        data = marshal.dumps(message, 4)  # SOCK_SEQPACKET keeps message boundaries: no length prefix
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.ctrl.sendmsg([data], ancillary)

    def _wait_for_record(self, timeout: float) -> object:
        with selectors.DefaultSelector() as sel:
            sel.register(self.ctrl, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise OSError(f"no answer within {timeout:.0f}s")
        data = self.ctrl.recv(MAX_RECORD_BYTES)
        if not data:
            raise OSError(f"it exited{self._stderr_tail()}")
        return json.loads(data)

    def _stderr_tail(self) -> str:
        if self.proc is None or self.proc.stderr is None or not self._wait(0.1):
            return ""
        os.set_blocking(self.proc.stderr.fileno(), False)
        try:
            text = os.read(self.proc.stderr.fileno(), 4096).decode(errors="replace").strip()[-300:]
        except OSError:
            return ""
        return f": {text}" if text else ""

    def start(self, session_dir: str, fds: list[int]) -> tuple[int, dict]:
        """Ask for a fresh worker on these pipe ends (job in, protocol, stdout, stderr). Returns the
        session's number and the job-header fields the worker needs (its cwd among them)."""
        self.sessions += 1
        try:
            self._send({"op": "run", "n": self.sessions}, fds)
        except OSError:
            self.broken = True
            raise
        return self.sessions, {**self.header, "cwd": self.runtime.session_cwd(self.dir, session_dir)}

    def poll(self, session: int) -> tuple[bool, int | None]:
        """Read one record: (True, exit status) once `session` is over; (True, None) if the server
        is gone or said something unexpected (it is then broken); (False, None) otherwise."""
        try:
            data = self.ctrl.recv(MAX_RECORD_BYTES)
        except BlockingIOError:
            return False, None
        except OSError:
            data = b""
        try:
            record = json.loads(data) if data else None
        except ValueError:
            record = None
        if type(record) is not dict or record.get("id") != session or type(record.get("exit")) is not int:
            self.broken = True
            if data:
                logger.warning("pre-warmed sandbox runner sent an unexpected record; retiring it")
            return True, None
        if record.get("retire") is not False:
            self.broken = True
        return True, record["exit"]

    def kill(self, session: int) -> None:
        """Ask the server to end `session` now (the worker and everything it started)."""
        try:
            self._send({"op": "kill", "n": session})
        except OSError:
            self.broken = True

    # ---- life cycle ----------------------------------------------------------------------
    def alive(self) -> bool:
        return not self.broken and not self.closed and self.proc is not None and not self._wait(0)

    def pids(self) -> set[int]:
        """Host process ids of the server itself (bwrap/unshare and the runner inside)."""
        if self.proc is None or self._wait(0):
            return set()
        inner = processes.children_of(self.proc.pid) if self.runtime.backend in backends.NAMESPACED else []
        return {self.proc.pid, *inner}

    def clear(self) -> None:
        """Delete whatever a session left in the server's directory (needed where the candidate
        runs as the trainer's own user and could write there)."""
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                backends.remove_workdir(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def terminate(self) -> None:
        """Kill the server and its whole sandbox at once."""
        self.broken = True
        if self.proc is not None and not self._wait(0):
            kill_tree(self.proc.pid, self.runtime.backend, self._wait)

    def _wait(self, seconds: float) -> bool:
        """Whether the server process ended within `seconds`. It is not reaped here, so its process
        group id cannot be reused before the group is killed."""
        end = time.monotonic() + seconds
        while self.proc.returncode is None:
            try:
                info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is not None and info.si_pid:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)
        return True

    def close(self) -> None:
        """Hang up: the server kills what is left and exits (its namespace goes with it)."""
        if self.closed:
            return
        self.closed = True
        self.ctrl.close()
        if self.proc is not None:
            if not self._wait(CLOSE_GRACE_S):
                self.terminate()
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left in its group
            try:
                self.proc.wait(REAP_WAIT_S)
            except subprocess.TimeoutExpired:  # unkillable (uninterruptible I/O): leave it, do not hang
                logger.error("pre-warmed sandbox runner %d did not die after SIGKILL", self.proc.pid)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        try:
            backends.remove_workdir(self.dir)
        except Exception as err:
            logger.error("could not remove sandbox dir %s: %s", self.dir, err)


class ServerPool:
    """Idle pre-warmed runners of one Sandbox: a session takes one (or starts one) and gives it back."""

    def __init__(self, runtime: backends.Runtime, root: str) -> None:
        self.runtime = runtime
        self.root = root
        self._lock = threading.Lock()
        self._idle: list[RunnerServer] = []
        self._all: set[RunnerServer] = set()
        self._closed = False

    def warm(self) -> None:
        """Start one server now, so the first completion does not wait for it (and a backend on
        which servers cannot start is known at start-up)."""
        self.release(self.acquire())

    def acquire(self) -> RunnerServer:
        """An idle server that is still alive, or a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise HarnessFault("the sandbox is closed")
                if not self._idle:
                    break
                server = self._idle.pop()
                if server.alive():
                    return server
                self._all.discard(server)
            server.close()  # died while idle (say, the OOM killer): discard it, try the next
        server = RunnerServer(self.runtime, self.root)
        with self._lock:
            self._all.add(server)
            closed = self._closed
        if closed:
            self.release(server)
            raise HarnessFault("the sandbox is closed")
        return server

    def release(self, server: RunnerServer) -> None:
        healthy = server.alive() and server.sessions < MAX_SESSIONS
        if healthy:
            try:
                server.clear()
            except OSError as err:
                logger.warning("could not clear a pre-warmed runner's dir (%s); retiring it", err)
                healthy = False
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(server)
                return
            self._all.discard(server)
        server.close()

    def pids(self) -> set[int]:
        with self._lock:
            servers = list(self._all)
        return {pid for server in servers for pid in server.pids()}

    def stop_idle(self) -> None:
        """Close the idle servers (they start again on demand)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._all.difference_update(idle)
        for server in idle:
            server.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers, self._idle = list(self._all), []
            self._all.clear()
        for server in servers:
            server.terminate()
            server.close()
