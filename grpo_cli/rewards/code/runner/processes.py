"""The process plumbing the runner's supervisor, server and worker share: prctl, descriptors, exit
statuses, and the killing of whatever the candidate left behind."""

from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, a tenth of a session
import os

HIGH_FD = 200  # protocol descriptors move here, out of the way of the candidate's own files
EXIT_HARNESS = 70  # the runner itself failed before the candidate ran (EX_SOFTWARE)
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


class Stop(Exception):
    """SIGTERM reached the supervisor: clean up now."""


def raise_stop(signum: int, frame: object) -> None:
    raise Stop()


_LIBC: list = []  # ctypes' handle on libc, loaded on first use


def prctl(option: int, value: int) -> None:
    import ctypes  # only the backends that need it pay for the import

    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    if _LIBC[0].prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def bind_private_tmp(workdir: str) -> None:
    """unshare backend (own mount namespace, no bwrap): the work dir also serves as /tmp, /var/tmp and
    /dev/shm, so nothing the candidate writes there outlives the session or lands in shared RAM."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for target in ("/var/tmp", "/dev/shm", "/tmp"):  # /tmp last: it hides the work dir's own path
        if os.path.isdir(target) and libc.mount(workdir.encode(), target.encode(), None, 4096, None) != 0:  # MS_BIND
            raise OSError(ctypes.get_errno(), f"bind {workdir} on {target}")


def move_high(fd: int) -> int:
    import fcntl

    try:
        new = fcntl.fcntl(fd, getattr(fcntl, "F_DUPFD_CLOEXEC", 1030), HIGH_FD)  # named in fcntl since 3.9
    except OSError:  # a soft RLIMIT_NOFILE below HIGH_FD
        new = os.dup(fd)
    os.close(fd)
    return new


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


def kill_descendants() -> None:
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


def exit_code(status: int) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else EXIT_HARNESS


def write_error(err: BaseException) -> None:
    """A harness failure before the hello, on stderr (the trainer shows its tail)."""
    os.write(2, f"runner: {type(err).__name__}: {err}\n".encode(errors="replace"))
