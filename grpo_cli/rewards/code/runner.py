"""The program that runs inside the sandbox, one process tree per completion (stdlib only, Python >= 3.8).

Started by the trainer as `python -I -S -B runner.py PROTO_FD` (no site, no user paths, no .pyc),
one process tree per completion, or pre-warmed as `runner.py --serve CTRL_FD` (`serve` below):

- The **supervisor** (this process; root when the trainer is root) reads the job header from stdin,
  forks the worker and then only waits. When the worker ends it makes sure nothing the candidate
  started survives: as PID 1 of a PID namespace it simply exits (the kernel kills the rest);
  otherwise it is a child subreaper, so orphans and `setsid` daemons come back to it to be killed.
  On SIGTERM (the trainer's deadline, `process` backend) it does the same at once.
- The **worker** applies the rlimits, drops to the unprivileged user, moves the protocol pipes to
  high close-on-exec descriptors, points fd 0 at /dev/null, and only then compiles the candidate.
- The **server** (`--serve`) is a supervisor that stays: the interpreter, the namespaces and the
  common imports are paid for once, and each completion is a fresh worker forked from it, with the
  pipes the trainer passes over the control socket. After each worker it kills and reaps everything
  left in the sandbox before it says the session is over, and retires itself when something could
  outlive a session (SysV IPC objects) so that no completion ever sees another's leftovers.

Protocol. In: length-prefixed marshal frames on stdin (the header, then `{"id": n, "args": (...),
"kwargs": {...}}` per call; trusted data, and marshal is built in, where importing json costs a
third of a session). Out: newline-delimited JSON records on PROTO_FD, which the trainer parses as
hostile input: a hello (`id` -1, sent before any candidate code runs, so a process that dies earlier
is the harness's fault), `ready` (`id` 0), then exactly one response per request. The candidate
shares this process and can write to that pipe too; it gains nothing: the trainer reads records
strictly in order, fails the completion on any extra or malformed one, and never reads a verdict,
only values, which it decodes itself and compares with expectations the sandbox never sees.

Values leave in a typed JSON encoding (`encode`/`decode`) that admits only exact builtin types:
`type(v) is int`, never `isinstance`, so no `__eq__` override can reach the trainer.
"""

from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, a tenth of a session
import marshal
import math
import os
import sys
from _json import encode_basestring_ascii as _quote  # C; the json package would pull in re, enum, ...

MAX_DEPTH = 64  # nesting of a value; deeper (or cyclic) results are not plain data
BIG_INT_BITS = 4000  # larger ints travel as hex: decimal str<->int is capped at 4300 digits since 3.11
HIGH_FD = 200  # protocol descriptors move here, out of the way of the candidate's own files
EXIT_HARNESS = 70  # the runner itself failed before the candidate ran (EX_SOFTWARE)
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


class NotPlainData(ValueError):
    """A value that is not made of exact builtin types."""


def _type_name(value: object) -> str:
    try:  # `type.__name__` read through `type` itself: a metaclass cannot override it
        return str(type.__dict__["__name__"].__get__(type(value), type))
    except Exception:
        return "?"


def encode(value: object, depth: int = 0) -> object:
    """Exact builtin values -> JSON-ready data; anything else raises NotPlainData.

    >>> encode([1, 2.5, "a", None, True, (1,), {1: b"x"}])
    [1, 2.5, 'a', None, True, {'t': [1]}, {'d': [[1, {'b': '78'}]]}]
    >>> encode(type("Int", (int,), {})(1))  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    NotPlainData: Int is not a builtin value
    """
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if value.bit_length() <= BIG_INT_BITS else {"x": hex(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is set:
        return {"s": [encode(v, depth + 1) for v in value]}
    if kind is frozenset:
        return {"f": [encode(v, depth + 1) for v in value]}
    raise NotPlainData(f"{_type_name(value)} is not a builtin value")


def to_json(data: object) -> str:
    r"""JSON text for `encode`'s output (and records made of it), the way `json.dumps` writes it.

    >>> to_json({"id": 1, "ok": [None, True, -2, 0.5, float("nan"), "\u00e9", {"t": []}]})
    '{"id": 1, "ok": [null, true, -2, 0.5, NaN, "\\u00e9", {"t": []}]}'
    """
    kind = type(data)
    if kind is str:
        return _quote(data)
    if data is None:
        return "null"
    if kind is bool:
        return "true" if data else "false"
    if kind is int:
        return int.__repr__(data)
    if kind is float:
        if math.isfinite(data):
            return float.__repr__(data)
        return "NaN" if data != data else "Infinity" if data > 0 else "-Infinity"
    if kind is list:
        return "[" + ", ".join([to_json(v) for v in data]) + "]"
    if kind is dict:
        return "{" + ", ".join([_quote(k) + ": " + to_json(v) for k, v in data.items()]) + "}"
    raise NotPlainData(f"{_type_name(data)} has no JSON form")


def frame(value: object) -> bytes:
    """One length-prefixed marshal frame (the trainer's side of the job pipe)."""
    data = marshal.dumps(value, 4)  # format 4 reads on every Python >= 3.4
    return b"%d\n" % len(data) + data


def read_frame(reader: object) -> object:
    """The next frame from `reader`; None at EOF."""
    line = reader.readline()
    if not line:
        return None
    size = int(line)
    data = reader.read(size)
    if len(data) != size:
        return None
    return marshal.loads(data)


def decode(data: object, depth: int = 0) -> object:
    """Inverse of `encode`, strict: malformed input raises ValueError (the trainer decodes hostile data).

    >>> decode({"t": [1, {"d": [[{"t": []}, {"b": "ff"}]]}, {"x": "-0x10"}]})
    (1, {(): b'\\xff'}, -16)
    >>> decode({"t": [1], "extra": 2})
    Traceback (most recent call last):
    ...
    ValueError: malformed value
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        ((tag, payload),) = data.items()
        if type(payload) is str:
            if tag == "x":
                return int(payload, 16)
            if tag == "b":
                return bytes.fromhex(payload)
        elif type(payload) is list:
            items = [decode(v, depth + 1) for v in payload]
            try:
                if tag == "t":
                    return tuple(items)
                if tag == "s":
                    return set(items)
                if tag == "f":
                    return frozenset(items)
                if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
                    return {k: v for k, v in items}
            except TypeError as err:  # an unhashable key or member
                raise ValueError(f"malformed value: {err}") from None
    raise ValueError("malformed value")


# ---- the two processes -----------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM reached the supervisor: clean up now."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


_LIBC: list = []  # ctypes' handle on libc, loaded on first use


def _prctl(option: int, value: int) -> None:
    import ctypes  # only the backends that need it pay for the import

    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    if _LIBC[0].prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _bind_private_tmp(workdir: str) -> None:
    """unshare backend (own mount namespace, no bwrap): the work dir also serves as /tmp, /var/tmp and
    /dev/shm, so nothing the candidate writes there outlives the session or lands in shared RAM."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for target in ("/var/tmp", "/dev/shm", "/tmp"):  # /tmp last: it hides the work dir's own path
        if os.path.isdir(target) and libc.mount(workdir.encode(), target.encode(), None, 4096, None) != 0:  # MS_BIND
            raise OSError(ctypes.get_errno(), f"bind {workdir} on {target}")


def children_of(pid: int) -> list[int]:
    """Processes whose parent is `pid` (a /proc scan: /proc/PID/task/*/children is not always built in)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and parens
            if len(fields) > 1 and int(fields[1]) == pid:
                found.append(int(name))
    return found


def _kill_descendants() -> None:
    """As a subreaper: kill every child; their orphans come back to us; repeat until none is left."""
    while True:  # the usual case, nothing left, is known without scanning /proc
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break  # children alive
        except ChildProcessError:  # no child at all; as subreaper, no orphan anywhere either
            return
    me = os.getpid()
    while True:
        for pid in children_of(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.wait()  # blocks until one of them is gone: no busy loop even under a fork bomb
        except ChildProcessError:
            return


def _exit_code(status: int) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else EXIT_HARNESS


def supervise(proto_fd: int) -> None:
    # The job pipe moves to a high descriptor and fd 0 becomes /dev/null: the candidate cannot read
    # (steal) requests through sys.stdin.
    job_fd = _move_high(0)
    null = os.open(os.devnull, os.O_RDWR)  # takes the lowest free number: 0
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    proto = _move_high(proto_fd)
    reader = os.fdopen(job_fd, "rb", closefd=False)  # the worker inherits it, read-ahead included
    header = read_frame(reader)
    if header.get("private_tmp"):
        _bind_private_tmp(header["workdir"])
    pid1 = os.getpid() == 1  # bwrap --as-pid-1 / unshare --fork: the namespace dies with us
    if not pid1:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _raise_stop)
    worker = os.fork()
    if worker == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            run_worker(header, reader, proto)
        except BaseException as err:  # only before the hello: afterwards the worker never raises
            os.write(2, f"runner: {type(err).__name__}: {err}\n".encode(errors="replace"))
        os._exit(EXIT_HARNESS)
    os.close(job_fd)  # the worker holds the only copies: its death is EOF for the trainer
    os.close(proto)
    status = 128 + signal.SIGKILL
    try:
        while True:
            pid, st = os.wait()
            if pid == worker:
                status = _exit_code(st)
                break
    except (_Stop, ChildProcessError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not pid1:
        _kill_descendants()
    os._exit(status)


# ---- the pre-warmed server ----------------------------------------------------------------------

# Imported once by the server, so a forked worker finds them loaded (each costs a fresh process
# 1-10 ms). A candidate changing one changes its own copy only.
PRELOAD = ("bisect", "collections", "fcntl", "functools", "heapq", "itertools", "re", "resource", "string", "typing")
SERVER_POLL_S = 0.01  # worker exit polling where os.pidfd_open is missing (Python < 3.9)
HELLO_ID = -2  # the server's first record on the control socket


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
        _kill_descendants()
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
                    return _exit_code(os.waitpid(worker, 0)[1]), hangup
            pid, status = os.waitpid(worker, os.WNOHANG)
            if pid == worker:
                return _exit_code(status), False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _start_session(ctrl: object, fds: list) -> None:
    """In the forked worker: drop the server's channel, put the session's pipes in place, run the job."""
    try:
        ctrl.close()  # the candidate must never reach the server's control channel
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _prctl(PR_SET_DUMPABLE, 1)  # as a one-shot runner would be (the drop to nobody clears it again)
        job_fd, proto_fd, out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _close_all([out_fd, err_fd])
        job = _move_high(job_fd)
        proto = _move_high(proto_fd)
        reader = os.fdopen(job, "rb", closefd=False)
        run_worker(read_frame(reader), reader, proto)
    except BaseException as err:  # only before the hello: afterwards the worker never raises
        try:
            os.write(2, f"runner: {type(err).__name__}: {err}\n".encode(errors="replace"))
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


def serve(ctrl_fd: int) -> None:
    """The pre-warmed runner: one fresh forked worker per `run` request, strictly one at a time.

    Control messages in: `setup` (once), then `{"op": "run", "n": N}` with the session's four pipe
    ends (job in, protocol out, stdout, stderr), and `{"op": "kill", "n": N}`. Out: a hello, then
    `{"id": N, "exit": STATUS, "retire": BOOL}` once session N and everything it started are gone.
    EOF on the control socket ends the server, and with it (PID 1, or as subreaper) its sandbox.
    """
    import _socket

    ctrl = _socket.socket(fileno=_move_high(ctrl_fd))
    setup, fds = _recv(ctrl)
    _close_all(fds)
    if type(setup) is not dict:
        os._exit(0)
    if setup.get("private_tmp"):
        _bind_private_tmp(setup["workdir"])
    pid1 = os.getpid() == 1  # bwrap --as-pid-1 / unshare --fork: signals we do not handle never reach us
    if not pid1:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, _raise_stop)  # `process` backend: the trainer's hard stop
    _prctl(PR_SET_DUMPABLE, 0)  # a candidate of the same uid can neither ptrace nor read this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if worker:
        try:
            os.kill(worker, signal.SIGKILL)
        except OSError:
            pass
    _end_session(pid1)
    os._exit(0)


def _move_high(fd: int) -> int:
    import fcntl

    try:
        new = fcntl.fcntl(fd, getattr(fcntl, "F_DUPFD_CLOEXEC", 1030), HIGH_FD)  # named in fcntl since 3.9
    except OSError:  # a soft RLIMIT_NOFILE below HIGH_FD
        new = os.dup(fd)
    os.close(fd)
    return new


def _apply_limits(limits: dict) -> None:
    import resource

    pairs = [
        (resource.RLIMIT_AS, limits["as_bytes"]),
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_FSIZE, limits["fsize_bytes"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits["nproc"]),  # counts per real uid: binding only once we are nobody
        (resource.RLIMIT_NOFILE, limits["nofile"]),  # after _move_high: existing high fds stay valid
    ]
    for which, value in pairs:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    sys.setrecursionlimit(limits["recursion"])


def _drop(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise OSError("privilege drop did not take")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError("could regain root after the drop")


def _dump(record: dict) -> bytes:
    return (to_json(record) + "\n").encode()


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _send(fd: int, record: dict) -> None:
    _write(fd, _dump(record))


def _describe(err: BaseException) -> str:
    try:
        text = str(err)[:500]
    except BaseException:
        text = "<unprintable>"
    name = _type_name(err)
    return f"{name}: {text}" if text else name


def run_worker(header: dict, reader: object, proto: int) -> None:
    if header["mode"] == "program":
        stdin = os.memfd_create("stdin")  # the program's stdin, written before FSIZE applies
        data = header["stdin"].encode()
        while data:
            data = data[os.write(stdin, data) :]
        os.lseek(stdin, 0, os.SEEK_SET)
        os.dup2(stdin, 0)
        os.close(stdin)
    _apply_limits(header["limits"])
    if header.get("no_new_privs"):
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary can hand privileges back
    if header["drop"]:
        _drop(header["uid"], header["gid"])
    os.chdir(header["cwd"])
    _send(proto, {"id": -1, "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid()})
    # ---- from here on candidate code runs; nothing below may raise ----
    if header["mode"] == "program":
        if not header.get("count"):
            os.close(proto)
            os._exit(_run_program(header["source"], None))
        counter = [0]
        status = _run_program(header["source"], counter)
        try:
            _send(proto, {"id": 1, "cost": counter[0]})
        except BaseException:
            pass
        os._exit(status)
    _serve_calls(header, reader, proto)


def _counting(counter: list) -> object:
    """A `sys.settrace` function that adds one to `counter[0]` per bytecode instruction executed
    in any Python frame: a deterministic measure of work (the same code on the same inputs counts
    the same on every run), unlike a clock. Builtins written in C count nothing."""

    def on_opcode(frame: object, event: str, arg: object) -> object:
        if event == "opcode":
            counter[0] += 1
        return on_opcode

    def on_call(frame: object, event: str, arg: object) -> object:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return on_opcode

    return on_call


def _run_program(source: str, counter: object) -> int:
    module = type(sys)("__main__")
    module.__file__ = "main.py"
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    status = 0
    try:
        code = compile(source, "main.py", "exec")
        if counter is not None:
            sys.settrace(_counting(counter))
        try:
            exec(code, module.__dict__)
        finally:
            sys.settrace(None)
    except SystemExit as exc:
        code = exc.code
        if code is None or type(code) is int:
            status = code or 0
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the interpreter's own traceback printer, no module to import
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status & 0xFF


def _serve_calls(header: dict, reader: object, proto: int) -> None:
    module = type(sys)("candidate")  # not __main__: `if __name__ == "__main__"` demos stay off
    sys.modules["candidate"] = module
    max_record = header["max_record_bytes"]
    try:
        code = compile(header["source"], "candidate.py", "exec")
    except BaseException as err:
        _send(proto, {"id": 0, "error": _describe(err), "kind": "syntax"})
        os._exit(0)
    fn = None
    try:
        if header.get("setup"):  # the task's trusted set-up (MBPP test_setup_code), before the candidate
            exec(compile(header["setup"], "setup.py", "exec"), module.__dict__)
        exec(code, module.__dict__)
        if header["entry_point"] is not None:
            fn = module.__dict__.get(header["entry_point"])
            if not callable(fn):
                _send(proto, {"id": 0, "error": f"no function {header['entry_point']!r}", "kind": "missing"})
                os._exit(0)
    except BaseException as err:
        _send(proto, {"id": 0, "error": _describe(err), "kind": "raised", "exc_type": _type_name(err)})
        os._exit(0)
    _send(proto, {"id": 0, "ok": None})
    while True:
        try:
            request = read_frame(reader)
            if request is None:
                os._exit(0)
            number, count = request["id"], request.get("count")
            if "expr" in request:  # a call written by the trusted test, evaluated where set-up classes exist
                call = compile(request["expr"], "test.py", "eval")
                args, kwargs = (call, module.__dict__), {}
                target = eval
            else:
                args, kwargs, target = request["args"], request["kwargs"], fn
        except BaseException:
            os._exit(EXIT_HARNESS)
        counter = [0]
        try:
            if count:
                sys.settrace(_counting(counter))
            try:
                value = target(*args, **kwargs)
            finally:
                sys.settrace(None)
        except BaseException as err:  # SystemExit and KeyboardInterrupt included: a failure, not an exit
            data = _dump({"id": number, "error": _describe(err), "kind": "raised", "exc_type": _type_name(err)})
        else:
            try:
                record = {"id": number, "ok": encode(value)}
                if count:
                    record["cost"] = counter[0]
                data = _dump(record)
                if len(data) > max_record:
                    data = _dump({"id": number, "error": f"result over {max_record} bytes", "kind": "non_strict"})
            except BaseException as err:  # NotPlainData, RecursionError, a dict changed by a thread, ...
                data = _dump({"id": number, "error": _describe(err), "kind": "non_strict"})
        try:
            _write(proto, data)
        except BaseException:
            os._exit(EXIT_HARNESS)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    else:
        supervise(int(sys.argv[1]))
