"""The pre-warmed runner (`--serve`): a supervisor that stays, forking a fresh worker per
completion so the interpreter, the namespaces and the common imports are paid for once."""

from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, a tenth of a session
import marshal
import os
import sys

from .processes import (
    EXIT_HARNESS,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    Stop,
    bind_private_tmp,
    exit_code,
    kill_descendants,
    move_high,
    prctl,
    raise_stop,
    write_error,
)
from .wire import HELLO_ID, encode, read_frame, to_json
from .worker import run_worker

# Imported once by the server, so a forked worker finds them loaded (each costs a fresh process
# 1-10 ms). A candidate changing one changes its own copy only.
PRELOAD = ("bisect", "collections", "fcntl", "functools", "heapq", "itertools", "re", "resource", "string", "typing")
SERVER_POLL_S = 0.01  # worker exit polling where os.pidfd_open is missing (Python < 3.9)


def _recv(ctrl: object) -> tuple[object, list[int]]:
    """One control message (marshal, from the trusted trainer) and the descriptors passed with it;
    (None, []) once the trainer has hung up."""
    import _socket

    flags = getattr(_socket, "MSG_CMSG_CLOEXEC", 0)
    data, ancillary, _, _ = ctrl.recvmsg(4096, _socket.CMSG_SPACE(4 * 8), flags)
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += [int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True) for i in range(0, usable, 4)]
    if not data:
        return None, fds
    try:
        return marshal.loads(data), fds
    except (EOFError, ValueError, TypeError):
        return {}, fds


def _close_all(fds: list) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _tell(ctrl: object, record: dict) -> None:
    try:
        ctrl.send(to_json(record).encode())
    except OSError:  # the trainer is gone: the next receive says so
        pass


def _end_session(pid1: bool) -> None:
    """Kill and reap every process left in the sandbox (orphans, setsid daemons, a fork bomb): no
    process outlives the session it belongs to."""
    if not pid1:
        kill_descendants()
        return
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # from PID 1 of the namespace: everyone in it except us
        except OSError:
            pass
        try:
            os.wait()
        except ChildProcessError:  # every orphan comes back to PID 1: no child means no process
            return


def _ipc_leftovers() -> bool:
    """SysV IPC objects outlive their processes. A namespace that holds one is not clean any more,
    so the server retires and the next completion gets a fresh namespace."""
    for kind in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + kind, "rb") as f:
                if len(f.read().splitlines()) > 1:  # a header line, then one line per object
                    return True
        except OSError:  # cannot tell: assume the worst
            return True
    return False


def _watch(ctrl: object, worker: int, session: object) -> tuple[int, bool]:
    """Wait until the worker exits or the trainer ends the session. Returns (exit status, whether
    the trainer hung up). A `kill` naming another session (one that already ended) is ignored."""
    import select

    try:
        pidfd = os.pidfd_open(worker)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            waits = [ctrl] if pidfd is None else [ctrl, pidfd]
            ready = select.select(waits, [], [], None if pidfd is not None else SERVER_POLL_S)[0]
            if ctrl in ready:
                request, fds = _recv(ctrl)
                _close_all(fds)
                hangup = request is None
                if hangup or (type(request) is dict and request.get("op") == "kill" and request.get("n") == session):
                    os.kill(worker, signal.SIGKILL)
                    return exit_code(os.waitpid(worker, 0)[1]), hangup
            pid, status = os.waitpid(worker, os.WNOHANG)
            if pid == worker:
                return exit_code(status), False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _start_session(ctrl: object, fds: list) -> None:
    """In the forked worker: drop the server's channel, put the session's pipes in place, run the job."""
    try:
        ctrl.close()  # the candidate must never reach the server's control channel
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        prctl(PR_SET_DUMPABLE, 1)  # as a one-shot runner would be (the drop to nobody clears it again)
        job_fd, proto_fd, out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _close_all([out_fd, err_fd])
        job = move_high(job_fd)
        proto = move_high(proto_fd)
        reader = os.fdopen(job, "rb", closefd=False)
        run_worker(read_frame(reader), reader, proto)
    except BaseException as err:  # only before the hello: afterwards the worker never raises
        try:
            write_error(err)
        except BaseException:
            pass
    os._exit(EXIT_HARNESS)


def _warm_up() -> None:
    """Pay once, in the server, for what every worker would otherwise pay after its fork: the
    common imports and the first use of the compiler and of the protocol code (the first compile
    in a process costs about a millisecond). Then freeze the heap for the garbage collector, so a
    worker's collections do not copy every page it inherited."""
    import gc

    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    namespace: dict = {}
    exec(compile("def f(a, b=1):\n    return [a + b, (a,), {a: str(b)}]\n", "warm.py", "exec"), namespace)
    to_json({"id": 1, "ok": encode(namespace["f"](1))})
    marshal.loads(marshal.dumps({"id": 1, "args": (1, "x"), "kwargs": {}}, 4))
    if hasattr(gc, "freeze"):  # Python >= 3.7
        gc.collect()
        gc.freeze()


def _become_server(setup: dict) -> bool:
    """The server's own set-up before any session: its mounts, who reaps orphans, which signals
    reach it. True when it is PID 1 of its namespace."""
    if setup.get("private_tmp"):
        bind_private_tmp(setup["workdir"])
    pid1 = os.getpid() == 1  # bwrap --as-pid-1 / unshare --fork: signals we do not handle never reach us
    if not pid1:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, raise_stop)  # `process` backend: the trainer's hard stop
    prctl(PR_SET_DUMPABLE, 0)  # a candidate of the same uid can neither ptrace nor read this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return pid1


def _shut_down(worker: int, pid1: bool) -> None:
    """Kill the session in progress, if any, and everything else in the sandbox; exit."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if worker:
        try:
            os.kill(worker, signal.SIGKILL)
        except OSError:
            pass
    _end_session(pid1)
    os._exit(0)


def serve(ctrl_fd: int) -> None:
    """The pre-warmed runner: one fresh forked worker per `run` request, strictly one at a time.

    Control messages in: `setup` (once), then `{"op": "run", "n": N}` with the session's four pipe
    ends (job in, protocol out, stdout, stderr), and `{"op": "kill", "n": N}`. Out: a hello, then
    `{"id": N, "exit": STATUS, "retire": BOOL}` once session N and everything it started are gone.
    EOF on the control socket ends the server, and with it (PID 1, or as subreaper) its sandbox.
    """
    import _socket

    ctrl = _socket.socket(fileno=move_high(ctrl_fd))
    setup, fds = _recv(ctrl)
    _close_all(fds)
    if type(setup) is not dict:
        os._exit(0)
    pid1 = _become_server(setup)
    _warm_up()
    _tell(ctrl, {"id": HELLO_ID, "pid": os.getpid(), "uid": os.getuid()})
    worker = 0
    try:
        while True:
            request, fds = _recv(ctrl)
            if request is None:
                break
            if type(request) is not dict or request.get("op") != "run" or len(fds) != 4:
                _close_all(fds)  # a late `kill` for a session that already ended
                continue
            worker = os.fork()
            if worker == 0:
                _start_session(ctrl, fds)
            _close_all(fds)
            status, hangup = _watch(ctrl, worker, request.get("n"))
            worker = 0
            _end_session(pid1)
            if hangup:
                break
            retire = bool(setup.get("namespaced")) and _ipc_leftovers()
            _tell(ctrl, {"id": request.get("n"), "exit": status, "retire": retire})
            if retire:
                break
    except Stop:
        pass
    _shut_down(worker, pid1)
