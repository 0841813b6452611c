"""The worker: the one process per completion that runs candidate code, after the rlimits and the
drop to the unprivileged user, and answers the trainer's calls with strict values."""

from __future__ import annotations

import os
import sys

from .processes import EXIT_HARNESS, PR_SET_NO_NEW_PRIVS, prctl
from .wire import encode, read_frame, to_json, type_name


def _apply_limits(limits: dict) -> None:
    import resource

    pairs = [
        (resource.RLIMIT_AS, limits["as_bytes"]),
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_FSIZE, limits["fsize_bytes"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits["nproc"]),  # counts per real uid: binding only once we are nobody
        (resource.RLIMIT_NOFILE, limits["nofile"]),  # after move_high: existing high fds stay valid
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
    name = type_name(err)
    return f"{name}: {text}" if text else name


def _trace(err: BaseException, source: str, frames: int = 3) -> str:
    """The last few lines of the candidate's own code the exception passed through, as
    `line N, in f: <source line>`: what a traceback tells the model (env=code_feedback), without
    importing `traceback` after the limits."""
    lines = source.splitlines()
    found = []
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == "candidate.py":
            number = tb.tb_lineno
            text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
            found.append(f"line {number}, in {code.co_name}: {text[:160]}")
        tb = tb.tb_next
    return "\n".join(found[-frames:])


def _flush(stream: object) -> None:
    try:
        stream.flush()
    except BaseException:
        pass


def _raised(number: object, err: BaseException, source: str) -> dict:
    return {
        "id": number,
        "error": _describe(err),
        "kind": "raised",
        "exc_type": type_name(err),
        "trace": _trace(err, source),
    }


def run_worker(header: dict, reader: object, proto: int) -> None:
    if header["mode"] == "program":
        stdin = os.memfd_create("stdin")  # the program's stdin, written before FSIZE applies
        _write(stdin, header["stdin"].encode())
        os.lseek(stdin, 0, os.SEEK_SET)
        os.dup2(stdin, 0)
        os.close(stdin)
    _apply_limits(header["limits"])
    if header.get("no_new_privs"):
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary can hand privileges back
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


def _load_candidate(header: dict, module: object, proto: int) -> object:
    """Run the task's set-up and the candidate's source in `module`; its entry point (None when
    the header names none). Reports a failure as the `ready` record and ends the worker."""
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
        _send(proto, _raised(0, err, header["source"]))
        os._exit(0)
    return fn


def _call_of(request: dict, module: object, fn: object) -> tuple[object, object, dict]:
    """What to call for one request: (target, args, kwargs)."""
    if "expr" in request:  # a call written by the trusted test, evaluated where set-up classes exist
        return eval, (compile(request["expr"], "test.py", "eval"), module.__dict__), {}
    return fn, request["args"], request["kwargs"]


def _answer(
    number: object, count: object, target: object, args: object, kwargs: dict, max_record: int, source: str
) -> bytes:
    """Make one call and write its record: the value as strict data, or why there is none."""
    counter = [0]
    try:
        if count:
            sys.settrace(_counting(counter))
        try:
            value = target(*args, **kwargs)
        finally:
            sys.settrace(None)
            _flush(sys.stdout)  # what it printed reaches the pipe now: the worker ends by os._exit
    except BaseException as err:  # SystemExit and KeyboardInterrupt included: a failure, not an exit
        return _dump(_raised(number, err, source))
    try:
        record = {"id": number, "ok": encode(value)}
        if count:
            record["cost"] = counter[0]
        data = _dump(record)
        if len(data) > max_record:
            data = _dump({"id": number, "error": f"result over {max_record} bytes", "kind": "non_strict"})
    except BaseException as err:  # NotPlainData, RecursionError, a dict changed by a thread, ...
        data = _dump({"id": number, "error": _describe(err), "kind": "non_strict"})
    return data


def _serve_calls(header: dict, reader: object, proto: int) -> None:
    module = type(sys)("candidate")  # not __main__: `if __name__ == "__main__"` demos stay off
    sys.modules["candidate"] = module
    max_record, source = header["max_record_bytes"], header["source"]  # read before the candidate runs
    fn = _load_candidate(header, module, proto)
    _send(proto, {"id": 0, "ok": None})
    while True:
        try:
            request = read_frame(reader)
            if request is None:
                os._exit(0)
            number, count = request["id"], request.get("count")
            target, args, kwargs = _call_of(request, module, fn)
        except BaseException:
            os._exit(EXIT_HARNESS)
        data = _answer(number, count, target, args, kwargs, max_record, source)
        try:
            _write(proto, data)
        except BaseException:
            os._exit(EXIT_HARNESS)
