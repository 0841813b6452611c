"""The two code rewards that run the completion, only ever in the sandbox (docs/architecture.md §3,
§5): `code_tests` (the share of unit tests passed) and `code_efficiency` (the work a passing one does).

The sandbox returns strict builtin values and this process, the trusted parent, compares them with
expected values the candidate never sees (`judge.py`). Anything the candidate causes scores 0; only
a harness fault (the sandbox cannot start or run at all) gives None. Importing this module starts
nothing: the sandbox is built on the first call and cached per process (`batch.py`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from grpo_cli.rewards.code.batch import BATCH_TIMEOUT_S, sandbox_backend, score_jobs, settings_key
from grpo_cli.rewards.code.judge import Task, VerdictMemo, judge, tasks_from_columns
from grpo_cli.rewards.code.sandbox import Sandbox
from grpo_cli.rewards.code.tasks import column, compiles, reaches_into_interpreter, strip_fences

TASK_COLUMNS = ("entry_point", "test", "test_list", "io", "test_setup_code", "test_imports", "challenge_test_list")
CODE_TEST_MODES = ("fraction", "all")  # code_tests kwargs.mode: share of units passed | 1 only if all pass
VERDICT_MEMO_SIZE = 4096  # recent code_tests verdicts code_efficiency reuses (it skips failing completions)

_VERDICTS = VerdictMemo(VERDICT_MEMO_SIZE)
_EMPTY_BODY_PASSES: dict[tuple[Any, ...], frozenset[int]] = {}  # (settings, task) -> units an empty body passes
_EMPTY_BODY_LOCK = threading.Lock()


def _empty_body_passes(sandbox: Sandbox, key: tuple[Any, ...], task: Task) -> frozenset[int] | None:
    """The units of `task` an empty body passes, judged once per task and process (one session);
    None on a harness fault (tried again next time)."""
    with _EMPTY_BODY_LOCK:
        if key in _EMPTY_BODY_PASSES:
            return _EMPTY_BODY_PASSES[key]
    verdict = judge(sandbox, task, task.empty_body())
    if verdict is None:
        return None
    with _EMPTY_BODY_LOCK:
        _EMPTY_BODY_PASSES[key] = verdict.passed_units
    return verdict.passed_units


def _check_mode(mode: str) -> None:
    if mode not in CODE_TEST_MODES:
        raise ValueError(f"code_tests kwargs.mode={mode!r}: expected one of {', '.join(CODE_TEST_MODES)}")


def code_tests(
    prompts: list[Any],
    completions: list[str],
    entry_point: list[str | None] | None = None,
    test: list[str | None] | None = None,
    test_list: list[list[str] | None] | None = None,
    io: list[list[dict[str, str]] | None] | None = None,
    *,
    mode: str = "fraction",
    batch_timeout_s: float = BATCH_TIMEOUT_S,
    **settings: Any,
) -> list[float | None]:
    """Unit tests in the sandbox, from whichever public shape the row has: `test` (HumanEval's
    check(candidate), one unit per assert statement), `test_list` (MBPP asserts, plus
    `challenge_test_list`, after `test_imports` and `test_setup_code`) or `io` (stdin/stdout
    cases). `mode=fraction` scores the share of units passed (dense), `mode=all` 1 only when every
    unit passes (pass@1 as the public benchmarks count it). A unit that never calls the candidate
    is not a unit. A row without tests scores None (nothing to judge).

    Source that does not compile scores 0 here without starting a process. The sandbox settings
    (`SandboxConfig`: backend, require_isolation, timeout_s, memory_mb, workers, prewarm) come
    from the config's `sandbox.*` section, overridden by the reward's own `kwargs`; completions
    run in parallel on `workers` threads, and the batch gets `batch_timeout_s` of wall clock in all.

    >>> code_tests(["def inc(x):\\n"], ["    return x +\\n"], entry_point=["inc"], test_list=[["assert inc(1) == 2"]])
    [0.0]
    """
    _check_mode(mode)
    n = len(completions)
    tasks = tasks_from_columns(prompts, n, entry_point, test, test_list, io, settings)
    scores: list[float | None] = [None] * n
    jobs: dict[int, Callable[[Sandbox], float | None]] = {}
    key = settings_key(settings)
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        if not task.runnable:
            continue  # None: the data gives nothing to judge
        program = task.program(completion)
        if not strip_fences(completion).strip() or not compiles(program):
            scores[i] = 0.0  # the candidate's fault, known without running anything
            continue
        jobs[i] = functools.partial(_tests_score, key=key, task=task, program=program, mode=mode)
    return score_jobs(scores, jobs, settings, batch_timeout_s)


def _tests_score(sandbox: Sandbox, key: tuple[Any, ...], task: Task, program: str, mode: str) -> float | None:
    """One completion's `code_tests` score, a job of its batch; None on a harness fault."""
    verdict = judge(sandbox, task, program)
    if verdict is None:
        return None
    _VERDICTS.put((key, program, task.key()), verdict)
    if not verdict.passed_units:
        return verdict.score(mode)
    empty_body = _empty_body_passes(sandbox, (key, task.key()), task)  # what passing without code earns
    return None if empty_body is None else verdict.score(mode, empty_body)


def _code_tests_diagnostics(mode: str = "fraction", **settings: Any) -> dict[str, Any]:
    """Start-up diagnostics: builds the sandbox now, so its backend is known (and shown) before the
    first batch, and require_isolation refuses to start rather than scoring None for ever."""
    _check_mode(mode)
    return {"sandbox_backend": sandbox_backend(**settings)}


code_tests.diagnostics = _code_tests_diagnostics  # type: ignore[attr-defined]
code_tests.takes_sandbox_settings = True  # type: ignore[attr-defined]  # `sandbox.*` fills its kwargs


# ---- efficiency ---------------------------------------------------------------------------------

_REFERENCE_COSTS: dict[tuple[Any, ...], int | None] = {}  # (settings, task) -> the reference's count
_REFERENCE_LOCK = threading.Lock()


def _reference_cost(sandbox: Sandbox, key: tuple[Any, ...], task: Task, reference: str) -> int | None:
    """Instructions the reference solution executes on the task's tests, once per task and
    process; None when the reference does not pass them itself (then nothing is measured)."""
    with _REFERENCE_LOCK:
        if key in _REFERENCE_COSTS:
            return _REFERENCE_COSTS[key]
    verdict = judge(sandbox, task, task.program(reference), count=True)
    if verdict is None:
        return None  # a harness fault: try again next batch
    cost = verdict.cost if verdict.all_passed else None
    with _REFERENCE_LOCK:
        _REFERENCE_COSTS[key] = cost
    return cost


def efficiency(reference_cost: int, cost: int) -> float:
    """min(1, reference / candidate) in executed bytecode instructions: 1 for a solution that does
    no more Python-level work than the reference, 1/k for one that does k times as much.

    >>> efficiency(2_000, 2_000), efficiency(2_000, 1_000), efficiency(2_000, 100_000), efficiency(10, 0)
    (1.0, 1.0, 0.02, 1.0)
    """
    return 1.0 if cost <= reference_cost else reference_cost / cost


def code_efficiency(
    prompts: list[Any],
    completions: list[str],
    reference: list[str | None] | None = None,
    entry_point: list[str | None] | None = None,
    test: list[str | None] | None = None,
    test_list: list[list[str] | None] | None = None,
    io: list[list[dict[str, str]] | None] | None = None,
    *,
    batch_timeout_s: float = BATCH_TIMEOUT_S,
    **settings: Any,
) -> list[float | None]:
    """How little work a passing completion does: `efficiency(reference's count, its count)`, where
    a count is the Python bytecode instructions executed on the task's own tests, counted inside
    the sandbox (deterministic: the same code scores the same on every run; no clock involved).

    0 for a completion that does not pass every unit (`code_tests` of the same batch says so
    without a second run), and for code that reaches into the interpreter (tracing, frames,
    getattr/eval/exec, os, threads: see `tasks.INTROSPECTION`), which could stop or forge its own
    count. None where the row has no tests or no reference, or the reference fails its own tests.
    C builtins count nothing (`sorted` is free): it measures the Python the model wrote.

    >>> code_efficiency(["def inc(x):\\n"], ["    return x +\\n"], reference=["    return x + 1\\n"],
    ...                 entry_point=["inc"], test_list=[["assert inc(1) == 2"]])
    [0.0]
    """
    n = len(completions)
    tasks = tasks_from_columns(prompts, n, entry_point, test, test_list, io, settings)
    references = column(reference, n)
    scores: list[float | None] = [None] * n
    jobs: dict[int, Callable[[Sandbox], float | None]] = {}
    key = settings_key(settings)
    for i, (task, completion, ref) in enumerate(zip(tasks, completions, references)):
        if not task.runnable or not ref:
            continue
        code = strip_fences(completion)
        program = task.program(completion)
        known = _VERDICTS.get((key, program, task.key()))
        failed = known is not None and not known.all_passed  # code_tests of this batch ran it already
        if not code.strip() or not compiles(program) or failed or reaches_into_interpreter(code):
            scores[i] = 0.0
            continue
        jobs[i] = functools.partial(_efficiency_score, key=key, task=task, program=program, ref=ref)
    return score_jobs(scores, jobs, settings, batch_timeout_s)


def _efficiency_score(sandbox: Sandbox, key: tuple[Any, ...], task: Task, program: str, ref: str) -> float | None:
    """One completion's `code_efficiency` score, a job of its batch; None on a harness fault."""
    reference_cost = _reference_cost(sandbox, (key, ref, task.key()), task, ref)
    if reference_cost is None:
        return None
    verdict = judge(sandbox, task, program, count=True)
    if verdict is None:
        return None
    if not verdict.all_passed or verdict.cost is None:
        return 0.0
    return efficiency(reference_cost, verdict.cost)


code_efficiency.diagnostics = _code_tests_diagnostics  # type: ignore[attr-defined]  # the same sandbox
code_efficiency.takes_sandbox_settings = True  # type: ignore[attr-defined]
