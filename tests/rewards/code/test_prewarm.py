"""Pre-warmed runners: one runner serves many completions, and no completion can tell, or use,
that another ran before it. Each case runs on every backend this machine has."""

from __future__ import annotations

import os

import pytest

from grpo_cli.rewards.code import CandidateFailure, Sandbox, SandboxConfig
from grpo_cli.rewards.code.sandboxed_rewards import code_tests
from tests.rewards.code.conftest import AS_ROOT, BACKENDS, ISOLATED, assert_clean, sandbox_processes


@pytest.fixture(params=BACKENDS)
def box(request, sandbox_factory) -> Sandbox:
    box = sandbox_factory(request.param, prewarm=True)
    if not box.prewarm:
        pytest.fail(f"the {box.backend} backend probes fine but could not start a pre-warmed runner")
    yield box
    assert_clean(box)


def call(box: Sandbox, source: str, *args):
    with box.session(source, "f") as s:
        return s.call(*args)


def test_runners_are_reused_and_each_completion_is_a_fresh_process(box):
    source = """
import collections, os
def f():
    seen = getattr(collections, "LEFT_BY_A_COMPLETION", None)
    collections.LEFT_BY_A_COMPLETION = os.getpid()   # a preloaded module: changed in this process only
    return [os.getpid(), seen]
"""
    call(box, "def f():\n    return 0\n")
    runners = box.server_pids()
    results = [call(box, source) for _ in range(4)]
    assert box.server_pids() == runners  # no new runner started: that is the saving
    assert [seen for _, seen in results] == [None] * 4
    assert len({pid for pid, _ in results}) == 4


def test_nothing_a_completion_leaves_reaches_the_next(box):
    marker = f"{os.getpid() % 1000}.{len(box.tag)}3"  # an unusual sleep duration to find the daemon by
    leave = f"""
import os, subprocess
def f():
    with open("note", "w") as fh:
        fh.write("from an earlier completion")
    written = []
    for path in ("/tmp/left", "/dev/shm/left", "/var/tmp/left"):
        try:
            with open(path, "w") as fh:
                fh.write("x")
            written.append(path)
        except OSError:
            pass
    subprocess.Popen(["sleep", "{marker}"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [os.path.abspath("note"), written]
"""
    look = """
import os
def f(paths):
    mine = os.getpid()
    others = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != mine:
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    others.append(fh.read().decode(errors="replace"))
            except OSError:
                pass
    return [os.listdir("."), [p for p in paths if os.path.exists(p)], others]
"""
    note, written = call(box, leave)
    cwd_entries, still_there, others = call(box, look, [note, *written])
    assert cwd_entries == [] and note not in still_there
    assert not any(f"sleep\0{marker}" in cmdline for cmdline in others)
    if box.backend in ISOLATED:
        assert still_there == []  # /tmp, /dev/shm, /var/tmp: not writable, or the runner's own (emptied) dir
        assert len(others) <= 1  # in its PID namespace the worker sees only its runner (PID 1)
    for path in written:  # `process` writes into the host's shared dirs: the documented exposure
        if box.backend == "process" and os.path.exists(path):
            os.remove(path)


@pytest.mark.parametrize("backend", ISOLATED)
def test_sysv_ipc_left_by_a_completion_retires_its_runner(sandbox_factory, backend):
    box = sandbox_factory(backend, prewarm=True)
    create = """
import ctypes
def f():
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.shmget(0, 4096, 0o1000 | 0o600)   # IPC_PRIVATE, IPC_CREAT: outlives the process
"""
    count = "def f():\n    with open('/proc/sysvipc/shm') as fh:\n        return len(fh.read().splitlines()) - 1\n"
    assert call(box, count) == 0
    runners = box.server_pids()
    assert call(box, create) >= 0
    assert call(box, count) == 0  # a fresh runner, in a fresh IPC namespace
    assert box.server_pids().isdisjoint(runners)
    assert_clean(box)


def test_a_candidate_cannot_take_its_runner_down(box):
    if box.backend == "process" and not AS_ROOT:
        pytest.skip("as the trainer's own user the candidate can kill its runner (the documented exposure)")
    source = """
import os, signal
def f():
    outcomes = []
    for pid in (os.getppid(), 1):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, sig)
                outcomes.append("sent")
            except OSError as err:
                outcomes.append(type(err).__name__)
    return outcomes
"""
    call(box, "def f():\n    return 0\n")
    runners = box.server_pids()
    call(box, source)
    assert call(box, "def f(x):\n    return x + 1\n", 1) == 2
    assert box.server_pids() == runners


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timeout_or_a_flood_costs_the_session_not_the_runner(sandbox_factory, backend):
    """The runner kills the worker and stays: a hostile completion costs its timeout, not a restart."""
    box = sandbox_factory(backend, prewarm=True, timeout_s=0.5)
    call(box, "def f():\n    return 0\n")
    runners = box.server_pids()
    stubborn = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ndef f():\n    while True:\n        pass\n"
    flood = "import os\ndef f():\n    while True:\n        os.write(1, b'x' * 65536)\n"
    for source, kind in ((stubborn, "timeout"), (flood, "output_flood")):
        with pytest.raises(CandidateFailure) as info:
            call(box, source)
        assert info.value.kind == kind
    assert call(box, "def f():\n    return 1\n") == 1
    assert box.server_pids() == runners
    assert_clean(box)


def test_idle_runners_stop_on_request_and_start_again():
    with Sandbox(SandboxConfig(backend="process", timeout_s=5)) as box:
        assert box.server_pids()
        box.stop_idle_runners()
        assert box.server_pids() == set() and sandbox_processes(box.tag) == []
        assert call(box, "def f():\n    return 7\n") == 7
        assert box.server_pids()
    assert sandbox_processes(box.tag) == [] and not os.path.exists(box.root)


def test_code_tests_scores_the_same_either_way():
    rows = {"entry_point": ["inc"] * 3, "test_list": [["assert inc(1) == 2", "assert inc(-1) == 0"]] * 3}
    completions = ["    return x + 1\n", "    return x + 2\n", "    while True:\n        pass\n"]
    prompts = ["def inc(x):\n"] * 3
    settings = {"backend": "process", "timeout_s": 1.0}
    warm = code_tests(prompts, completions, **rows, **settings, prewarm=True)
    cold = code_tests(prompts, completions, **rows, **settings, prewarm=False)
    assert warm == cold == [1.0, 0.0, 0.0]
