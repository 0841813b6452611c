"""How a sandboxed runner is launched on each backend, and the start-up probe that proves it works.

- `bwrap` (bubblewrap): a private root with read-only /usr, /lib*, a few /etc files and the
  interpreter's prefix; the session's work dir is the only writable place and serves as /tmp;
  new network, PID, IPC, UTS and cgroup namespaces; the runner is PID 1, so the namespace (and
  everything the candidate started) dies with it. As root, bwrap keeps only CAP_SETUID/CAP_SETGID,
  which the runner spends on dropping to nobody.
- `unshare` (util-linux): new network, PID, IPC, UTS and mount namespaces around the same runner;
  the host filesystem stays visible (read-only for nobody), except /tmp, /var/tmp and /dev/shm,
  which the work dir covers.
- `process`: the runner alone: rlimits, the drop to nobody and a subreaper that kills leftovers.

A probe runs a real job through the real launch path, as the unprivileged user, and checks what it
sees (its uid, the network interfaces, its PID) before a backend is trusted.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from grpo_cli.rewards.code import runner as runner_package
from grpo_cli.rewards.code.runner.wire import frame

NAMESPACED = ("bwrap", "unshare")
PROBE_ORDER = ("bwrap", "unshare", "process")  # `auto` takes the first that passes its probe
NOBODY = 65534  # uid and gid the candidate runs as when the trainer is root
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # the child's whole environment: no secrets travel
TOOL_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"
RUNNER_SCRIPT = "__main__.py"  # the runner package's entry script, started by its path
INSIDE_RUNNER = "/runner"  # where bwrap shows the runner package
INSIDE_WORKDIR = "/tmp"  # the work dir as the candidate sees it (bwrap, unshare)
FILE_SIZE_LIMIT_BYTES = 16 * 1024 * 1024  # RLIMIT_FSIZE: one file; enough for any honest test
OPEN_FILES_LIMIT = 64  # RLIMIT_NOFILE
PROCESSES_PER_WORKER = 16  # RLIMIT_NPROC counts every process of the uid, so it grows with `workers`
RECURSION_LIMIT = 3000  # a little above Python's 1000; deeper C recursion would overflow the stack
PROBE_TIMEOUT_S = 30.0  # a cold start on a loaded machine; the probe runs once per Sandbox
ETC_FILES = (  # the minimal /etc a Python program expects (dynamic linker, time zone, user names)
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # next to /usr; often symlinks into it
PROBE_SOURCE = """
import decimal, os, statistics  # imported after the drop: the stdlib must be readable by nobody

def probe():
    try:
        with open("/proc/net/dev") as f:
            nets = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    except OSError:
        nets = None
    return [os.getuid(), os.getpid(), nets, str(statistics.mean([decimal.Decimal(1), decimal.Decimal(2)]))]
"""


@dataclass(frozen=True)
class Interpreter:
    """A Python the runner can use, with the directories it needs to read (bound into bwrap)."""

    path: str
    prefixes: tuple[str, ...]


@dataclass
class Launch:
    """One runner start: the argv, where to start it, and the job-header fields the backend sets."""

    argv: list[str]
    cwd: str
    header: dict = field(default_factory=dict)


def running_as_root() -> bool:
    return os.geteuid() == 0


def find_tool(backend: str) -> str | None:
    return shutil.which(backend, path=TOOL_PATH) if backend in NAMESPACED else "builtin"


@functools.cache
def _describe_interpreter(path: str) -> Interpreter | None:
    code = "import sys; print(sys.base_prefix); print(sys.base_exec_prefix); print(sys.version_info >= (3, 8))"
    try:
        out = subprocess.run(
            [path, "-I", "-S", "-c", code], env=dict(ENV), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 3 or lines[2] != "True":
        return None
    return Interpreter(path, tuple(dict.fromkeys(os.path.realpath(p) for p in lines[:2])))


def interpreters() -> list[Interpreter]:
    """This trainer's own base interpreter first (same Python version), then system ones: a base
    interpreter under a 0700 home (pyenv in /root) is unreadable once the runner drops to nobody,
    which only bwrap can work around (it binds the prefix into a world-readable path)."""
    import sys

    paths = [getattr(sys, "_base_executable", None) or sys.executable, sys.executable, "/usr/bin/python3"]
    found = []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths if p):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            described = _describe_interpreter(path)
            if described is not None:
                found.append(described)
    return found


def limits(memory_mb: int, timeout_s: float, workers: int) -> dict:
    return {
        "as_bytes": int(memory_mb) * 1024 * 1024,
        "cpu_s": math.ceil(timeout_s) + 1,  # a backstop: the parent's wall clock acts first
        "fsize_bytes": FILE_SIZE_LIMIT_BYTES,
        "nofile": OPEN_FILES_LIMIT,
        "nproc": PROCESSES_PER_WORKER * max(1, workers),
        "recursion": RECURSION_LIMIT,
    }


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _bwrap_argv(tool: str, python: Interpreter, runner: str, workdir: str, as_root: bool, serve: bool) -> list[str]:
    argv = [tool, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    # A server is started from whichever worker thread needed it first; --die-with-parent would
    # kill it with that thread. It dies with the trainer through EOF on its control socket instead.
    argv += ["--new-session", "--as-pid-1"] if serve else ["--die-with-parent", "--new-session", "--as-pid-1"]
    if as_root:  # no user namespace: the runner is real root, with just enough to become nobody
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if serve:  # to kill what each session leaves (uid nobody) before the next one starts
            argv += ["--cap-add", "CAP_KILL"]
    else:
        argv += ["--unshare-user"]
    argv += ["--ro-bind", "/usr", "/usr"]
    bound = ["/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
            bound.append(path)
    for path in ETC_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    made = set(bound)
    for prefix in python.prefixes + (os.path.dirname(python.path),):
        if _under(prefix, bound):
            continue
        # Parents of a prefix under /root would be created 0700: nobody could not reach the stdlib.
        parts = prefix.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                argv += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        argv += ["--ro-bind", prefix, prefix]
        bound.append(prefix)
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, INSIDE_WORKDIR]
    return argv + ["--ro-bind", os.path.dirname(runner), INSIDE_RUNNER, "--chdir", "/", "--"]


def launch(
    backend: str, python: Interpreter, runner: str, workdir: str, fd: int, tag: str = "", serve: bool = False
) -> Launch:
    """The argv and header fields that start `runner` on `backend`: for one session (`fd` is the
    protocol pipe) or, with `serve`, as a pre-warmed server (`fd` is its control socket; `workdir`
    holds one directory per session). `tag` only marks the command line (and so every process the
    candidate forks) for `ps` and for leak checks."""
    as_root = running_as_root()
    common = {"drop": as_root, "uid": NOBODY, "gid": NOBODY, "workdir": workdir}
    run = [python.path, "-I", "-S", "-B", runner, *(["--serve"] if serve else []), str(fd), tag]
    if backend == "bwrap":
        argv = _bwrap_argv(find_tool("bwrap") or "bwrap", python, runner, workdir, as_root, serve)
        run[4] = f"{INSIDE_RUNNER}/{RUNNER_SCRIPT}"
        return Launch(argv + run, workdir, {**common, "cwd": INSIDE_WORKDIR})
    if backend == "unshare":
        argv = [find_tool("unshare") or "unshare", "--mount", "--net", "--pid", "--ipc", "--uts"]
        argv += ["--fork", "--kill-child", "--mount-proc"]
        if not as_root:
            argv += ["--user", "--map-root-user"]
        header = {"cwd": INSIDE_WORKDIR, "private_tmp": True, "no_new_privs": True}
        return Launch([*argv, "--", *run], workdir, {**common, **header})
    if backend == "process":
        return Launch(run, workdir, {**common, "cwd": workdir, "no_new_privs": True})
    raise ValueError(f"unknown sandbox backend {backend!r}")


@dataclass(frozen=True)
class Runtime:
    """What every launch of one Sandbox shares: the backend its probe chose, the interpreter, the
    runner's entry script on the host and the tag on every command line."""

    backend: str
    python: Interpreter
    runner: str
    tag: str

    def launch(self, workdir: str, fd: int, serve: bool = False) -> Launch:
        return launch(self.backend, self.python, self.runner, workdir, fd, self.tag, serve)

    def session_cwd(self, server_dir: str, session_dir: str) -> str:
        """A server's session dir as its worker sees it: bwrap and unshare show the server's dir as /tmp."""
        if self.backend in NAMESPACED:
            return f"{INSIDE_WORKDIR}/{os.path.relpath(session_dir, server_dir)}"
        return session_dir


def install_runner(root: str) -> str:
    """Copy the runner package into `root/runner` (readable by the candidate's user, which runs
    it); the path of its entry script. Its files import one another as the package `runner`."""
    source = os.path.dirname(runner_package.__file__)
    target = os.path.join(root, "runner")
    os.mkdir(target)
    os.chmod(target, 0o755)
    for name in sorted(os.listdir(source)):
        if name.endswith(".py"):
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            os.chmod(os.path.join(target, name), 0o644)
    return os.path.join(target, RUNNER_SCRIPT)


def make_workdir(root: str) -> str:
    """A fresh directory only the candidate's user can enter (0700, owned by nobody when we are root)."""
    import tempfile

    path = tempfile.mkdtemp(prefix="w-", dir=root)
    if running_as_root():
        os.chown(path, NOBODY, NOBODY)
    return path


def remove_workdir(path: str) -> None:
    """rmtree first; `rm -rf` when the candidate nested directories deeper than Python's recursion."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except (OSError, RecursionError):  # chmod first: without root a 0000 directory stops rm as well
        subprocess.run(["chmod", "-R", "u+rwx", "--", path], env=dict(ENV), capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", "--", path], env=dict(ENV), capture_output=True, timeout=60)


def probe(backend: str, python: Interpreter, runner: str, work_root: str) -> str | None:
    """Run one tiny job through `backend` with `python`; None if it works, else what went wrong."""
    tool = find_tool(backend)
    if tool is None:
        return f"`{backend}` is not installed"
    workdir = make_workdir(work_root)
    read_fd, write_fd = os.pipe()
    try:
        spec = launch(backend, python, runner, workdir, write_fd)
        try:
            done = subprocess.run(
                spec.argv,
                input=_probe_job(spec.header),
                capture_output=True,
                pass_fds=(write_fd,),
                cwd=spec.cwd,
                env=dict(ENV),
                start_new_session=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{backend} with {python.path}: {err}"
        os.close(write_fd)
        write_fd = -1
        os.set_blocking(read_fd, False)
        try:
            raw = os.read(read_fd, 1 << 20)
        except BlockingIOError:
            raw = b""
        return _probe_verdict(backend, python, done, raw)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
        remove_workdir(workdir)


def _probe_job(launch_header: dict) -> bytes:
    """The probe's job pipe: its header (a call of PROBE_SOURCE's `probe`, under small limits) and one call."""
    header = {
        **launch_header,
        "mode": "call",
        "source": PROBE_SOURCE,
        "entry_point": "probe",
        "limits": limits(256, PROBE_TIMEOUT_S, 1),
        "max_record_bytes": 65536,
    }
    return frame(header) + frame({"id": 1, "args": (), "kwargs": {}})


def _probe_verdict(backend: str, python: Interpreter, done: subprocess.CompletedProcess, raw: bytes) -> str | None:
    """None if the probe's records show an isolated runner that dropped its privileges and answered
    right; else what went wrong, in words a user can act on."""
    stderr = done.stderr.decode(errors="replace").strip()[-400:]
    try:
        records = [json.loads(line) for line in raw.decode().splitlines()]
    except ValueError:
        records = []
    if len(records) >= 2 and records[0].get("uid") is not None and "error" in records[1]:
        return (
            f"{backend} with {python.path}: after dropping to uid {records[0]['uid']} the probe could not "
            f"import the standard library ({records[1]['error']}): is it under a 0700 home such as /root?"
        )
    try:
        hello, ready, answer = records
        uid, pid, nets, mean = answer["ok"]
    except (ValueError, KeyError, TypeError):
        return f"{backend} with {python.path}: the probe job failed (exit {done.returncode}): {stderr or raw[-200:]}"
    if running_as_root():
        want_uid = NOBODY
    else:  # no drop possible; unshare maps us to root inside our own user namespace
        want_uid = 0 if backend == "unshare" else os.geteuid()
    if hello.get("uid") != want_uid or uid != want_uid:
        return f"{backend}: the runner did not drop to uid {want_uid} (it ran as {uid})"
    if backend in NAMESPACED and (nets != ["lo"] or pid > 10):
        return f"{backend}: no private network/PID namespace (interfaces {nets}, pid {pid})"
    if mean != "1.5" or ready != {"id": 0, "ok": None}:
        return f"{backend}: unexpected probe answer {records!r}"
    return None
