"""What a policy under RL pressure tries, on every backend, with the outcome each attempt must get.

Outcomes: `pass` (the check passed: only for attacks whose damage is a side effect, which is then
checked to be blocked), `wrong` (a strict value the trusted parent compared and rejected), or
`failure:<kind>` (CandidateFailure). After every case no process of the sandbox but its idle
pre-warmed runners may be left and every work dir must be empty; after the module (idle runners
stopped), no process of uid 65534 and no extra open descriptor.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from grpo_cli.rewards.code import CandidateFailure, Sandbox
from tests.rewards.code.conftest import (
    AS_ROOT,
    ISOLATED,
    assert_clean,
    open_fds,
    processes_of_uid,
    processes_running,
)

CASES = (((1, 2), 3), ((5, 7), 12))  # the trusted (inputs, expected) pairs; the sandbox never sees the second half


def judge(sandbox: Sandbox, source: str, cases=CASES) -> str:
    """HumanEval-style check in the parent: `assert add(*args) == expected` on strict values."""
    try:
        with sandbox.session(textwrap.dedent(source), "add") as s:
            for args, expected in cases:
                if not s.call(*args) == expected:
                    return "wrong"
        return "pass"
    except CandidateFailure as err:
        return f"failure:{err.kind}"


def _foreign(pid: int, ours: set[str]) -> bool:
    """A process of another sandbox on this machine (say, a concurrent test run), not ours."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
    except OSError:
        return True  # already gone
    return "grpo-sandbox-" in cmdline and not any(tag in cmdline for tag in ours)


@pytest.fixture(scope="module")
def used_tags() -> set[str]:
    return set()


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind(used_tags, sandbox_factory):
    for box in sandbox_factory.boxes():  # their runners hold descriptors: count without them
        box.stop_idle_runners()
    fds = open_fds()
    nobody = processes_of_uid(65534)
    yield
    for box in sandbox_factory.boxes():
        box.stop_idle_runners()
    assert open_fds() == fds
    if AS_ROOT:
        assert {pid for pid in processes_of_uid(65534) - nobody if not _foreign(pid, used_tags)} == set()


@pytest.fixture
def guarded(sandbox, used_tags):
    """The sandbox, checked after the case: no process of a session alive, no work dir left."""
    used_tags.add(sandbox.tag)
    yield sandbox
    assert_clean(sandbox)


# ---- forged verdicts -------------------------------------------------------------------------

ALWAYS_EQUAL = """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __hash__(self):
        return 0

def add(a, b):
    return AlwaysEqual()
"""

INT_SUBCLASS = """
class Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__

def add(a, b):
    return Int(0)
"""

STR_SUBCLASS = """
class Str(str):
    def __eq__(self, other):
        return True

def add(a, b):
    return Str("x")
"""

LIST_SUBCLASS = """
class List(list):
    def __eq__(self, other):
        return True

def add(a, b):
    return List()
"""

NESTED_ALWAYS_EQUAL = ALWAYS_EQUAL.replace("return AlwaysEqual()", "return [AlwaysEqual(), {'k': AlwaysEqual()}]")

SYS_EXIT_AT_IMPORT = """
import sys
sys.exit(0)
def add(a, b):
    return 0
"""

SYS_EXIT_IN_CALL = """
def add(a, b):
    import sys
    sys.exit(0)
"""

OS_EXIT_AT_IMPORT = """
import os
os._exit(0)
"""

OS_EXIT_IN_CALL = """
def add(a, b):
    import os
    os._exit(0)
"""

ATEXIT_EXIT_ZERO = """
import atexit, os
atexit.register(lambda: os._exit(0))
def add(a, b):
    raise AssertionError("wrong on purpose; hoping the exit code decides")
"""

FAKE_STDOUT_VERDICT = """
import sys
print("PASSED\\nall tests passed\\n" + '{"id": 1, "ok": 3}\\n{"id": 2, "ok": 12}')
print('{"id": 1, "ok": 3}', file=sys.stderr)
def add(a, b):
    print("OK", '{"id": 2, "ok": 12}')
    return 0
"""

FORGE_ON_EVERY_FD = """
import os
FAKE = b'{"id": 1, "ok": 3}\\n{"id": 2, "ok": 12}\\n'
def add(a, b):
    for fd in range(3, 1024):
        try:
            os.write(fd, FAKE)
        except OSError:
            pass
    return 0
"""

FORGE_VIA_PROC_FD = """
import os
def add(a, b):
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                os.write(int(name), b'{"id": 1, "ok": 3}\\n{"id": 2, "ok": 12}\\n')
        except OSError:
            pass
    return 0
"""

FAKE_RESULT_FILES = """
import json
for name in ("results.json", "../results.json", "verdict.txt"):
    try:
        with open(name, "w") as f:
            json.dump({"passed": True, "score": 1.0}, f)
    except OSError:
        pass
def add(a, b):
    return 0
"""

PATCH_RUNNER_ENCODER = """
import sys
runner = sys.modules["runner.worker"]  # the runner's module that encodes results
runner.encode = lambda value, depth=0: 3
def add(a, b):
    return object()
"""

PATCH_JSON_MODULE = """
import json, sys
sys.modules["json"].dumps = lambda *args, **kwargs: '{"id": 1, "ok": 3}'
def add(a, b):
    return None
"""

PATCH_RUNNER_WRITER = """
import sys
sys.modules["runner.worker"]._dump = lambda record: b'{"id": 1, "ok": 3}\\n'
def add(a, b):
    return None
"""

RAISE_SYSTEM_EXIT = "def add(a, b):\n    raise SystemExit(0)\n"
RAISE_KEYBOARD_INTERRUPT = "def add(a, b):\n    raise KeyboardInterrupt\n"
RAISE_BASE_EXCEPTION = "class Out(BaseException):\n    pass\n\ndef add(a, b):\n    raise Out()\n"

# ---- resource exhaustion ---------------------------------------------------------------------

INFINITE_LOOP = "def add(a, b):\n    while True:\n        pass\n"

IGNORE_SIGALRM = """
import signal
signal.signal(signal.SIGALRM, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def add(a, b):
    while True:
        pass
"""

SLEEP = "import time\ndef add(a, b):\n    time.sleep(100)\n"

FORK_BOMB = """
import os
def add(a, b):
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""

SETSID_DAEMON = """
import os, time
def add(a, b):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(100)
        os._exit(0)
    os.wait()
    return a + b
"""

MEMORY_BOMB = "def add(a, b):\n    hog = []\n    while True:\n        hog.append(bytearray(50_000_000))\n"

STDOUT_FLOOD = "def add(a, b):\n    while True:\n        print('x' * 10_000)\n"

STDERR_FLOOD = "import sys\ndef add(a, b):\n    while True:\n        sys.stderr.write('y' * 10_000)\n"

ONE_GB_FILE = """
def add(a, b):
    with open("big.bin", "wb") as f:
        for _ in range(1024):
            f.write(b"0" * (1 << 20))
    return a + b
"""

TEN_THOUSAND_FILES = """
import os
def add(a, b):
    os.makedirs("many", exist_ok=True)
    for i in range(10_000):
        with open(f"many/{i}", "w") as f:
            f.write("x")
    return a + b
"""

DEEP_DIRECTORIES = """
import os
def add(a, b):
    if a == 1:
        fd = os.open(".", os.O_RDONLY)
        for _ in range(1500):  # deeper than the trainer's recursion limit: shutil.rmtree gives up
            os.mkdir("d")
            os.chdir("d")
        os.fchdir(fd)
        os.chmod("d", 0)
    return a + b
"""

DEEP_RECURSION = "def add(a, b):\n    return add(a, b) + 1\n"

UNBOUNDED_RECURSION = """
import sys
sys.setrecursionlimit(10 ** 7)
def add(a, b):
    return add(a, b) + 1
"""

DEEPLY_NESTED_RESULT = "def add(a, b):\n    x = []\n    for _ in range(10_000):\n        x = [x]\n    return x\n"

CYCLIC_RESULT = "def add(a, b):\n    x = []\n    x.append(x)\n    return x\n"

# ---- escaping and signalling -----------------------------------------------------------------

KILL_PARENT = "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return a + b\n"

KILL_EVERYTHING = "import os, signal\ndef add(a, b):\n    os.kill(-1, signal.SIGKILL)\n    return a + b\n"

KILL_OWN_RUNNER = "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n"

STOP_SELF = "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGSTOP)\n    return a + b\n"

STEAL_THE_JOB_PIPE = """
import os
def add(a, b):
    for fd in range(3, 1024):
        try:
            os.set_blocking(fd, False)
            os.read(fd, 1 << 16)
        except OSError:
            pass
    return a + b
"""

REGAIN_ROOT = "import os\ndef add(a, b):\n    os.setuid(0)\n    return a + b\n"

ATTACKS = {
    # name: (source, outcomes accepted on every backend)
    "always-equal": (ALWAYS_EQUAL, {"failure:non_strict"}),
    "int-subclass-eq": (INT_SUBCLASS, {"failure:non_strict"}),
    "str-subclass-eq": (STR_SUBCLASS, {"failure:non_strict"}),
    "list-subclass-eq": (LIST_SUBCLASS, {"failure:non_strict"}),
    "nested-always-equal": (NESTED_ALWAYS_EQUAL, {"failure:non_strict"}),
    "sys-exit-at-import": (SYS_EXIT_AT_IMPORT, {"failure:raised"}),
    "sys-exit-in-call": (SYS_EXIT_IN_CALL, {"failure:raised"}),
    "os-exit-at-import": (OS_EXIT_AT_IMPORT, {"failure:crashed"}),
    "os-exit-in-call": (OS_EXIT_IN_CALL, {"failure:crashed"}),
    "atexit-exit-zero": (ATEXIT_EXIT_ZERO, {"failure:raised"}),
    "fake-stdout-verdict": (FAKE_STDOUT_VERDICT, {"wrong"}),
    "forge-records-on-every-fd": (FORGE_ON_EVERY_FD, {"failure:protocol"}),
    "forge-records-via-proc-fd": (FORGE_VIA_PROC_FD, {"failure:protocol", "wrong"}),  # "wrong": /proc/self/fd hidden
    "fake-result-files": (FAKE_RESULT_FILES, {"wrong"}),
    "patch-runner-encoder": (PATCH_RUNNER_ENCODER, {"wrong"}),
    "patch-json-module": (PATCH_JSON_MODULE, {"wrong", "failure:protocol"}),
    "patch-runner-record-writer": (PATCH_RUNNER_WRITER, {"failure:protocol"}),
    "raise-system-exit": (RAISE_SYSTEM_EXIT, {"failure:raised"}),
    "raise-keyboard-interrupt": (RAISE_KEYBOARD_INTERRUPT, {"failure:raised"}),
    "raise-base-exception": (RAISE_BASE_EXCEPTION, {"failure:raised"}),
    "infinite-loop": (INFINITE_LOOP, {"failure:timeout"}),
    "ignore-sigalrm-and-sigterm": (IGNORE_SIGALRM, {"failure:timeout"}),
    "sleep-100s": (SLEEP, {"failure:timeout"}),
    "fork-bomb": (FORK_BOMB, {"failure:timeout", "failure:protocol", "failure:crashed"}),
    "setsid-daemon": (SETSID_DAEMON, {"pass"}),  # harmless for the score; `guarded` checks it was killed
    "memory-bomb": (MEMORY_BOMB, {"failure:raised", "failure:crashed", "failure:timeout"}),  # timeout: swapping
    "stdout-flood": (STDOUT_FLOOD, {"failure:output_flood"}),
    "stderr-flood": (STDERR_FLOOD, {"failure:output_flood"}),
    "one-gb-file": (ONE_GB_FILE, {"failure:raised"}),
    # `guarded` checks the work dir is gone; a slow disk may not create 10,000 files within the session
    "ten-thousand-files": (TEN_THOUSAND_FILES, {"pass", "failure:timeout"}),
    "deep-directories-chmod-0": (DEEP_DIRECTORIES, {"pass"}),
    "deep-recursion": (DEEP_RECURSION, {"failure:raised"}),
    "unbounded-recursion": (UNBOUNDED_RECURSION, {"failure:raised", "failure:crashed", "failure:timeout"}),
    "deeply-nested-result": (DEEPLY_NESTED_RESULT, {"failure:non_strict"}),
    "cyclic-result": (CYCLIC_RESULT, {"failure:non_strict"}),
    "kill-parent": (KILL_PARENT, {"failure:raised"} if AS_ROOT else {"failure:raised", "failure:crashed", "pass"}),
    # kill(-1) spares the caller; nothing else of uid nobody is visible (namespaces) or alive (process)
    "kill-everything-visible": (KILL_EVERYTHING, {"failure:raised", "pass"}),
    "kill-own-runner": (KILL_OWN_RUNNER, {"failure:crashed"}),
    "stop-self": (STOP_SELF, {"failure:timeout"}),
    "steal-the-job-pipe": (STEAL_THE_JOB_PIPE, {"failure:timeout", "failure:crashed", "pass"}),
    "regain-root": (REGAIN_ROOT, {"failure:raised"} if AS_ROOT else {"failure:raised", "pass"}),
}
# On `process`, kill(-1) reaches every process of the candidate's uid on the machine: as nobody,
# any other sandbox running now (a concurrent test run, another trainer); without root, the test
# run itself. That is the exposure the start-up warning describes; the case runs only in namespaces.
NAMESPACES_ONLY = {"kill-everything-visible"}
# Cases that run into the deadline get a 0.75 s session to keep the suite short.
HANGS = {
    "infinite-loop",
    "ignore-sigalrm-and-sigterm",
    "sleep-100s",
    "fork-bomb",
    "stop-self",
    "steal-the-job-pipe",
    "unbounded-recursion",
    "ten-thousand-files",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack(guarded, sandbox_factory, used_tags, name):
    if name in NAMESPACES_ONLY and guarded.backend == "process":
        pytest.skip("would signal every process of the same uid on this machine: the documented exposure")
    source, accepted = ATTACKS[name]
    if name in HANGS:
        box = sandbox_factory(guarded.backend, timeout_s=0.75, prewarm=guarded.cfg.prewarm)
    else:
        box = guarded
    used_tags.add(box.tag)
    outcome = judge(box, source)
    assert outcome in accepted, f"{name} on {box.backend}: {outcome}"
    assert_clean(box)


def test_the_honest_twin_passes(guarded):
    """The same harness accepts a correct solution, so the outcomes above are the attacks' doing."""
    assert judge(guarded, "def add(a, b):\n    return a + b\n") == "pass"


def test_a_record_forged_after_the_last_answer_fails_the_completion(guarded):
    """A thread writes a fake record on the guessed protocol descriptor once the calls are done."""
    source = """
import os, threading, time
def late():
    time.sleep(0.2)
    for fd in range(3, 1024):
        try:
            os.write(fd, b'{"id": 3, "ok": "PASSED"}\\n')
        except OSError:
            pass
def add(a, b):
    if a == 5:
        threading.Thread(target=late, daemon=True).start()
    return a + b
"""
    with pytest.raises(CandidateFailure) as info:
        with guarded.session(source, "add") as s:
            for args, expected in CASES:
                assert s.call(*args) == expected
            time.sleep(0.6)  # the trusted check is still busy when the forged record arrives
    assert info.value.kind == "protocol"


# ---- what the candidate can see and touch ----------------------------------------------------


def test_secrets_in_the_trainer_environment_do_not_reach_the_candidate(guarded, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2")
    source = """
import os
def add():
    try:
        with open("/proc/self/environ") as f:
            environ = f.read()
    except OSError:
        environ = ""
    return [os.environ.get("GRPO_TEST_SECRET"), environ]
"""
    with guarded.session(source, "add") as s:
        value, environ = s.call()
    assert value is None and "hunter2" not in environ


@pytest.mark.skipif(not AS_ROOT, reason="without root the candidate runs as the trainer's own user")
def test_private_homes_are_unreadable(guarded, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "secret").write_text("hunter2")
    source = f"""
import os
def add():
    found = []
    for path in ({str(home / "secret")!r}, "/root/.bash_history", "/root/.ssh/id_rsa"):
        try:
            with open(path) as f:
                found.append(f.read())
        except OSError:
            pass
    try:
        for name in os.listdir("/root"):
            try:
                with open(os.path.join("/root", name)) as f:
                    found.append(f.read(100))
            except OSError:
                pass
    except OSError:
        pass
    return found
"""
    with guarded.session(source, "add") as s:
        assert s.call() == []


@pytest.fixture
def outside_dir():
    """A directory in the shared /tmp that everyone may read but only its owner may change."""
    path = Path(tempfile.mkdtemp(prefix="grpo-attack-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not AS_ROOT, reason="without root the process backend can delete the trainer's files")
def test_files_outside_the_work_dir_survive(guarded, outside_dir):
    outside = outside_dir
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    victim.chmod(0o644)
    source = f"""
import os, shutil
def add():
    for attempt in (lambda: os.remove({str(victim)!r}), lambda: shutil.rmtree({str(outside)!r})):
        try:
            attempt()
        except OSError:
            pass
    return os.path.exists({str(victim)!r})
"""
    with guarded.session(source, "add") as s:
        s.call()
    assert victim.read_text() == "keep me"


def test_the_network_is_unreachable_from_isolated_backends(guarded):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))  # never anything beyond this machine
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        source = f"""
import socket
def add():
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
        return "connected"
    except OSError as err:
        return type(err).__name__
"""
        with guarded.session(source, "add") as s:
            outcome = s.call()
        if guarded.backend in ISOLATED:
            assert outcome != "connected"
            with pytest.raises(OSError):  # socket.timeout is an OSError: nothing ever knocked
                listener.accept()[0].close()
        else:
            assert outcome == "connected"  # the documented exposure of `process`
            listener.accept()[0].close()


def test_shared_temp_dirs_stay_clean_on_isolated_backends(guarded):
    names = [f"/tmp/{guarded.tag}-leak", f"/dev/shm/{guarded.tag}-leak", f"/var/tmp/{guarded.tag}-leak"]
    source = f"""
def add():
    written = []
    for name in {names!r}:
        try:
            with open(name, "w") as f:
                f.write("x")
            written.append(name)
        except OSError:
            pass
    return written
"""
    with guarded.session(source, "add") as s:
        s.call()
    leaked = [name for name in names if os.path.exists(name)]
    for name in leaked:
        os.remove(name)
    if guarded.backend in ISOLATED:
        assert leaked == []  # inside, those paths were the (now deleted) work dir or not writable


def test_the_candidate_cannot_see_or_signal_the_trainer(guarded):
    if guarded.backend == "process" and not AS_ROOT:
        pytest.skip("as the trainer's own user the candidate could kill this test run (the documented exposure)")
    source = f"""
import os, signal
def add():
    try:
        os.kill({os.getpid()}, signal.SIGKILL)
        return "sent"
    except OSError as err:
        return type(err).__name__
"""
    with guarded.session(source, "add") as s:
        outcome = s.call()
    if guarded.backend in ISOLATED:
        assert outcome == "ProcessLookupError"  # another PID namespace: the trainer does not exist there
    elif AS_ROOT:
        assert outcome == "PermissionError"


def test_an_execed_daemon_in_its_own_session_is_killed(guarded):
    """`sleep` in a new session carries neither the sandbox's tag nor its process group."""
    marker = f"{os.getpid() % 1000}.{len(guarded.tag)}7"  # an unusual duration to find it by
    source = f"""
import subprocess
def add(a, b):
    subprocess.Popen(["sleep", "{marker}"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    return a + b
"""
    assert judge(guarded, source) == "pass"
    assert processes_running(b"sleep\0" + marker.encode()) == []


@pytest.mark.parametrize("prewarm", [True, False], ids=["prewarm", "oneshot"])
def test_bwrap_shows_no_home_no_repo_and_no_host_tmp(sandbox_factory, used_tags, prewarm):
    box = sandbox_factory("bwrap", prewarm=prewarm)
    used_tags.add(box.tag)
    repo = str(Path(__file__).resolve().parents[3])
    source = f"""
import os
def add():
    tmp = sorted(os.listdir("/tmp"))
    return sorted(os.listdir("/")), os.path.exists({repo!r}), os.path.exists("/home"), tmp, os.getcwd()
"""
    with box.session(source, "add") as s:
        top, repo_visible, home_visible, tmp, cwd = s.call()
    assert not repo_visible and not home_visible
    # /tmp is the session's own work dir (one-shot), or holds only it (a pre-warmed runner's dir)
    assert tmp == ([] if cwd == "/tmp" else [os.path.basename(cwd)])
    assert set(top) <= {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "etc",
        "proc",
        "dev",
        "tmp",
        "runner",
        "root",
        "opt",
    }
