"""The one-shot runner's first process: it starts one completion's worker and makes sure nothing
the candidate started outlives it."""

from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, a tenth of a session
import os

from .processes import (
    EXIT_HARNESS,
    PR_SET_CHILD_SUBREAPER,
    Stop,
    bind_private_tmp,
    exit_code,
    kill_descendants,
    move_high,
    prctl,
    raise_stop,
    write_error,
)
from .wire import read_frame
from .worker import run_worker


def _job_pipes(proto_fd: int) -> tuple[int, int]:
    """The job pipe (fd 0) and the protocol pipe, moved to high descriptors, and fd 0 pointed at
    /dev/null: the candidate cannot read (steal) requests through sys.stdin."""
    job_fd = move_high(0)
    null = os.open(os.devnull, os.O_RDWR)  # takes the lowest free number: 0
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    return job_fd, move_high(proto_fd)


def supervise(proto_fd: int) -> None:
    """Read the header, fork the worker, wait for it, kill what it left; exit with its status."""
    job_fd, proto = _job_pipes(proto_fd)
    reader = os.fdopen(job_fd, "rb", closefd=False)  # the worker inherits it, read-ahead included
    header = read_frame(reader)
    if header.get("private_tmp"):
        bind_private_tmp(header["workdir"])
    pid1 = os.getpid() == 1  # bwrap --as-pid-1 / unshare --fork: the namespace dies with us
    if not pid1:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, raise_stop)
    worker = os.fork()
    if worker == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            run_worker(header, reader, proto)
        except BaseException as err:  # only before the hello: afterwards the worker never raises
            write_error(err)
        os._exit(EXIT_HARNESS)
    os.close(job_fd)  # the worker holds the only copies: its death is EOF for the trainer
    os.close(proto)
    status = 128 + signal.SIGKILL
    try:
        while True:
            pid, st = os.wait()
            if pid == worker:
                status = exit_code(st)
                break
    except (Stop, ChildProcessError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not pid1:
        kill_descendants()
    os._exit(status)
