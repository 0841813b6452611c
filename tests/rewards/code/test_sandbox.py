"""The sandbox on every backend this machine has: honest values, failures, programs, backend choice."""

from __future__ import annotations

import logging
import math
import os
import time

import pytest

from grpo_cli.config import schema
from grpo_cli.rewards.code import CandidateFailure, HarnessFault, Sandbox, SandboxConfig, backends
from grpo_cli.rewards.code import sandbox as sandbox_module
from tests.rewards.code.conftest import AS_ROOT, ISOLATED, isolation_missing, leftovers, sandbox_processes

IDENTITY = "def f(*args, **kwargs):\n    return args[0] if args else kwargs\n"


def same(a, b) -> bool:
    """Equal *and* of exactly the same types all the way down (True == 1 would hide a bug)."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    if type(a) is float:
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


PLAIN_VALUES = [
    0,
    -7,
    3**5000,  # past Python's 4300-digit str<->int cap: travels as hex
    2.5,
    -0.0,
    float("inf"),
    float("nan"),
    'héllo \u2603 \n "quoted"',
    "",
    True,
    False,
    None,
    b"\x00\xffbytes",
    [1, [2, [3, []]]],
    (1, ("a", None)),
    (),
    {"a": 1, 2: [3.0], (4, 5): {"nested": (True,)}, None: b""},
    {1, 2, 3},
    frozenset({"x"}),
    [{"k": [1.5, "s", (None,)]}],
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=[f"v{i}" for i in range(len(PLAIN_VALUES))])
def test_plain_values_round_trip_exactly(sandbox, value):
    with sandbox.session(IDENTITY, "f") as s:
        assert same(s.call(value), value)


def test_honest_function_and_kwargs(sandbox):
    source = "def add(a, b=0, *, scale=1):\n    return (a + b) * scale\n"
    with sandbox.session(source, "add") as s:
        assert s.call(1, 2) == 3 and type(s.call(1, 2)) is int
        assert s.call(1.5, b=2) == 3.5
        assert s.call("a", "b", scale=2) == "abab"
        assert s.call([1], [2]) == [1, 2]
        assert s.failure is None


def test_a_check_function_runs_in_the_parent(sandbox):
    """HumanEval shape: the trusted check asserts on strict values the parent holds."""
    check = "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n    assert candidate([]) == []\n"
    namespace: dict = {}
    exec(check, namespace)
    with sandbox.session("def sort_list(xs):\n    return sorted(xs)\n", "sort_list") as s:
        namespace["check"](lambda *a, **k: s.call(*a, **k))
    with pytest.raises(AssertionError):
        with sandbox.session("def sort_list(xs):\n    return xs\n", "sort_list") as s:
            namespace["check"](lambda *a, **k: s.call(*a, **k))


def test_mutating_inputs_stays_in_the_child(sandbox):
    source = "def f(xs):\n    xs.append(99)\n    return len(xs)\n"
    data = [1, 2]
    with sandbox.session(source, "f") as s:
        assert s.call(data) == 3
        assert s.call(data) == 3  # a fresh copy each call
    assert data == [1, 2]


@pytest.mark.parametrize(
    "body",
    [
        "class C:\n    pass\nresult = C()",
        "class I(int):\n    def __eq__(self, other):\n        return True\nresult = I(1)",
        "class A:\n    def __eq__(self, other):\n        return True\nresult = A()",
        "result = (x for x in [1])",
        "result = [1, object()]",
        "import collections\nresult = collections.OrderedDict(a=1)",
        "result = 1j",
    ],
    ids=["custom-class", "int-subclass", "always-equal", "generator", "object-in-list", "dict-subclass", "complex"],
)
def test_non_plain_results_fail_and_end_the_session(sandbox, body):
    source = body + "\n\ndef f():\n    return result\n"
    with pytest.raises(CandidateFailure) as info:
        with sandbox.session(source, "f") as s:
            try:
                s.call()
            finally:
                assert s.failure is not None and s.failure.kind == "non_strict"
            s.call()
    assert info.value.kind == "non_strict"


def test_a_raised_exception_fails_the_call_not_the_session(sandbox):
    source = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    with sandbox.session(source, "f") as s:
        with pytest.raises(CandidateFailure) as info:
            s.call(-1)
        assert info.value.kind == "raised" and info.value.exc_type == "ValueError"
        assert "negative" in str(info.value)
        assert s.call(4) == 4
        assert s.failure is None


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("def f(:\n    pass\n", "syntax"),
        ("def f():\n\treturn 1\n        return 2\n", "syntax"),
        ("x = 1\n", "missing"),
        ("f = 3\n", "missing"),
        ("raise RuntimeError('at import')\ndef f():\n    return 1\n", "raised"),
        ("def f():\n    return 1\n\0", "syntax"),
    ],
    ids=["syntax", "indentation", "no-function", "not-callable", "import-raises", "nul-byte"],
)
def test_broken_sources_fail_at_session_start(sandbox, source, kind):
    with pytest.raises(CandidateFailure) as info:
        with sandbox.session(source, "f"):
            pytest.fail("the session should not have started")
    assert info.value.kind == kind


def test_oversized_source_is_not_run(sandbox):
    with pytest.raises(CandidateFailure) as info:
        with sandbox.session("x = 1\n" * 20_000, "f"):
            pass
    assert info.value.kind == "too_large"
    with pytest.raises(CandidateFailure):
        sandbox.run_program("print(1)\n" * 20_000, "")


def test_a_session_without_entry_point_only_imports(sandbox):
    with sandbox.session("import math\nX = math.pi\n", None) as s:
        with pytest.raises(HarnessFault):
            s.call()


def test_inputs_that_are_not_plain_data_are_a_harness_fault(sandbox):
    with sandbox.session(IDENTITY, "f") as s:
        with pytest.raises(HarnessFault):
            s.call(object())
        assert s.call(1) == 1


def test_the_deadline_covers_the_whole_session(sandbox, sandbox_factory):
    box = sandbox_factory(sandbox.backend, timeout_s=1.0, prewarm=sandbox.cfg.prewarm)
    source = "import time\ndef f(t):\n    time.sleep(t)\n    return t\n"
    start = time.monotonic()
    with pytest.raises(CandidateFailure) as info:
        with box.session(source, "f") as s:
            assert s.call(0.4) == 0.4
            s.call(0.4)
            s.call(0.4)  # the third call crosses the 1 s session clock
    assert info.value.kind == "timeout" and s.failure is not None
    assert time.monotonic() - start < box.cfg.timeout_s + 1.5
    with pytest.raises(CandidateFailure):
        s.call(0)  # a dead session stays dead
    assert leftovers(box) == []


def test_run_program_reads_stdin_and_captures_stdout(sandbox):
    source = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nprint('note', file=sys.stderr)\n"
    result = sandbox.run_program(source, "2 40\n")
    assert result.stdout == "42\n" and result.stderr == "note\n"
    assert result.exit_code == 0 and not result.timed_out


def test_run_program_reports_exit_codes_and_tracebacks_without_trusting_them(sandbox):
    assert sandbox.run_program("import sys\nprint('x')\nsys.exit(3)\n", "").exit_code == 3
    broken = sandbox.run_program("print(1/0)\n", "")
    assert broken.exit_code == 1 and "ZeroDivisionError" in broken.stderr and broken.stdout == ""
    assert sandbox.run_program("def (\n", "").exit_code == 1
    big = "\n".join(str(i) for i in range(200_000)) + "\n"  # stdin larger than any pipe buffer
    assert sandbox.run_program("import sys\nprint(len(sys.stdin.read().split()))\n", big).stdout == "200000\n"


def test_run_program_timeout_and_flood(sandbox, sandbox_factory):
    box = sandbox_factory(sandbox.backend, timeout_s=1.0, prewarm=sandbox.cfg.prewarm)
    hung = box.run_program("while True:\n    pass\n", "")
    assert hung.timed_out and hung.exit_code is None
    with pytest.raises(CandidateFailure) as info:
        sandbox.run_program("while True:\n    print('x' * 1000)\n", "")
    assert info.value.kind == "output_flood"
    assert leftovers(sandbox) == [] and leftovers(box) == []


def test_the_candidate_runs_unprivileged_with_a_minimal_environment(sandbox):
    source = "import os\ndef f():\n    return [os.getuid(), os.getgid(), sorted(os.environ)]\n"
    with sandbox.session(source, "f") as s:
        uid, gid, env = s.call()
    if AS_ROOT:
        assert (uid, gid) == (backends.NOBODY, backends.NOBODY)
    assert set(env) <= {"PATH", "LANG", "LC_CTYPE", "PWD"}  # bwrap sets PWD


def test_run_many_runs_sessions_on_worker_threads(sandbox_factory):
    box = sandbox_factory("process", workers=2)

    def score(n: int) -> int:
        with box.session("def sq(x):\n    return x * x\n", "sq") as s:
            return s.call(n)

    assert box.run_many(score, range(6)) == [0, 1, 4, 9, 16, 25]


# ---- backend choice --------------------------------------------------------------------------


def _sandbox_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "grpo.sandbox" and r.levelno >= logging.WARNING]


def test_auto_picks_the_first_backend_that_passes_its_probe(caplog):
    with caplog.at_level(logging.INFO, logger="grpo.sandbox"):
        with Sandbox(SandboxConfig(backend="auto")) as box:
            working = box.backend
    for name in ("bwrap", "unshare"):
        if backends.find_tool(name) is None:
            continue
        if working == name:
            break
        assert any(name in failure for failure in box.probe_failures), box.probe_failures
    if working in ISOLATED:
        assert _sandbox_warnings(caplog) == []


def test_auto_falls_back_to_process_with_one_loud_warning(monkeypatch, caplog):
    real = backends.find_tool
    monkeypatch.setattr(backends, "find_tool", lambda name: None if name in ISOLATED else real(name))
    with caplog.at_level(logging.INFO, logger="grpo.sandbox"):
        with Sandbox(SandboxConfig(backend="auto", timeout_s=2)) as box:
            assert box.backend == "process"
            with box.session("def f():\n    return 1\n", "f") as s:
                assert s.call() == 1
            box.run_program("print(1)\n", "")
    warnings = _sandbox_warnings(caplog)
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "apt-get install bubblewrap" in text and "network" in text and "not installed" in text


def test_a_probe_order_the_caller_controls(caplog):
    with caplog.at_level(logging.WARNING, logger="grpo.sandbox"):
        with Sandbox(SandboxConfig(backend="auto"), _probe_order=("process",)) as box:
            assert box.backend == "process"
    assert len(_sandbox_warnings(caplog)) == 1


def test_require_isolation_refuses_to_run_without_namespaces(monkeypatch):
    with pytest.raises(HarnessFault, match="require_isolation"):
        Sandbox(SandboxConfig(backend="process", require_isolation=True))
    real = backends.find_tool
    monkeypatch.setattr(backends, "find_tool", lambda name: None if name in ISOLATED else real(name))
    with pytest.raises(HarnessFault, match="bubblewrap"):
        Sandbox(SandboxConfig(backend="auto", require_isolation=True))


def test_require_isolation_is_met_by_a_namespace_backend():
    if not any(backends.find_tool(name) for name in ISOLATED):
        isolation_missing("neither bwrap nor unshare is installed")
    try:
        box = Sandbox(SandboxConfig(backend="auto", require_isolation=True))
    except HarnessFault as err:
        isolation_missing(f"no namespace backend works here: {err}")
    with box:
        assert box.backend in ISOLATED


def test_an_explicit_backend_that_does_not_work_is_a_harness_fault(monkeypatch):
    monkeypatch.setattr(backends, "find_tool", lambda name: None if name == "bwrap" else "builtin")
    with pytest.raises(HarnessFault, match="bwrap"):
        Sandbox(SandboxConfig(backend="bwrap"))


def test_no_usable_interpreter_is_a_harness_fault(monkeypatch):
    monkeypatch.setattr(backends, "interpreters", lambda: [])
    with pytest.raises(HarnessFault, match="interpreter"):
        Sandbox(SandboxConfig(backend="process"))


def test_the_settings_are_the_sandbox_config_section():
    """One class: what `sandbox.*` composes is what Sandbox takes; the byte limits are constants."""
    assert SandboxConfig is schema.SandboxConfig
    assert schema.TrainConfig().sandbox == schema.ScoreConfig().sandbox == SandboxConfig()
    assert not hasattr(SandboxConfig(), "max_output_bytes") and not hasattr(SandboxConfig(), "max_source_bytes")
    assert sandbox_module.MAX_SOURCE_BYTES < len("x = 1\n" * 20_000)  # what test_oversized_source_is_not_run sends


def test_config_errors():
    with pytest.raises(ValueError, match="backend"):
        Sandbox(SandboxConfig(backend="docker"))
    with pytest.raises(ValueError):
        Sandbox(SandboxConfig(timeout_s=0))


def test_close_kills_live_sessions_and_removes_the_temp_root():
    box = Sandbox(SandboxConfig(backend="process", timeout_s=5))
    manager = box.session("import time\ndef f():\n    time.sleep(30)\n", "f")
    manager.__enter__()
    assert sandbox_processes(box.tag)
    box.close()
    assert sandbox_processes(box.tag) == []
    assert not os.path.exists(box.root)
