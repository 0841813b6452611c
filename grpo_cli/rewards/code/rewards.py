"""The code reward as four functions in the fusion (DESIGN.md §3, seed 001): `code_compiles`,
`code_tests`, `code_style`, `code_similarity`, so curricula and reports address each by name.

Only `code_tests` runs the completion, and only in the sandbox (DESIGN.md §6): the sandbox
returns strict builtin values and this process, the trusted parent, compares them with expected
values the candidate never sees. Anything the candidate causes scores 0; only a harness fault
(the sandbox cannot start or run at all) gives None. The other three are cheap static checks on
capped input. Importing this module starts nothing: the sandbox is built on the first
`code_tests` call and cached per process, one per distinct set of sandbox settings.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from functools import lru_cache
from typing import Any

from grpo_cli.config.schema import SandboxConfig
from grpo_cli.rewards.code.tasks import (
    PASSED,
    CallCase,
    assemble_program,
    check_units,
    compiles,
    output_lines,
    parse_test_list,
    prompt_text,
    strict_equal,
    strip_fences,
)

BATCH_TIMEOUT_S = 50.0  # a batch's wall clock for code_tests; below the executor's 60 s default watchdog
TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\S")  # identifiers, numbers, single symbols

_SANDBOXES: dict[tuple[Any, ...], Any] = {}  # sandbox settings -> Sandbox, one per process
_SANDBOX_LOCK = threading.Lock()


# ---- the sandbox, built lazily -----------------------------------------------------------


def _sandbox(**settings: Any) -> Any:
    """The process's Sandbox for these settings (the `SandboxConfig` fields among them, the
    `sandbox.*` defaults for the rest; data columns and other kwargs are ignored). Probing the
    backend happens once, here."""
    from grpo_cli.rewards.code.sandbox import Sandbox  # only when code is judged

    names = [f.name for f in dataclasses.fields(SandboxConfig)]
    config = SandboxConfig(**{name: settings[name] for name in names if name in settings})
    key = dataclasses.astuple(config)
    with _SANDBOX_LOCK:
        sandbox = _SANDBOXES.get(key)
        if sandbox is None:
            sandbox = _SANDBOXES[key] = Sandbox(config)  # a HarnessFault here is not cached: retried next batch
    return sandbox


def sandbox_backend(**settings: Any) -> str:
    """The backend the sandbox with these settings runs on (bwrap, unshare or process), for
    diagnostics; builds that sandbox if this process has none yet."""
    return _sandbox(**settings).backend


@atexit.register
def close_sandboxes() -> None:
    """Close every cached sandbox (also at interpreter exit)."""
    with _SANDBOX_LOCK:
        sandboxes = list(_SANDBOXES.values())
        _SANDBOXES.clear()
    for sandbox in sandboxes:
        sandbox.close()


# ---- cheap static checks -----------------------------------------------------------------


def _column(values: list[Any] | None, n: int) -> list[Any]:
    return [None] * n if values is None else list(values)


def code_compiles(
    prompts: list[Any], completions: list[str], entry_point: list[str | None] | None = None, **_: Any
) -> list[float]:
    """1.0 when the program (prompt + completion when the completion is a function body) compiles.

    Nothing runs: `compile()` on the fence-stripped source, capped at 100k characters. An empty
    completion scores 0, or the prompt's signature and docstring alone would earn the point.

    >>> code_compiles(["def inc(x):\\n"] * 3, ["    return x + 1\\n", "    return x +\\n", ""], entry_point=["inc"] * 3)
    [1.0, 0.0, 0.0]
    """
    entry_point = _column(entry_point, len(completions))
    return [
        float(bool(strip_fences(c).strip()) and compiles(assemble_program(p, c, e)))
        for p, c, e in zip(prompts, completions, entry_point)
    ]


class _ErrorLines:
    """A pycodestyle report that only records the line of each error (no printing, no files)."""

    def __init__(self, options: Any) -> None:
        import pycodestyle

        self._base = pycodestyle.BaseReport(options)
        self.lines: list[int] = []

    def error(self, line_number: int, offset: int, text: str, check: Any) -> str | None:
        code = self._base.error(line_number, offset, text, check)
        if code:  # None when the code is ignored by the options
            self.lines.append(line_number)
        return code

    def __getattr__(self, name: str) -> Any:  # init_file, counters, ...: the base report's
        return getattr(self._base, name)


@lru_cache(maxsize=8)
def _style_options(max_line_length: int) -> Any:
    import pycodestyle

    return pycodestyle.StyleGuide(quiet=True, max_line_length=max_line_length).options


def _style_score(prompt: Any, completion: str, entry_point: str | None, max_line_length: int) -> float:
    import pycodestyle

    code = strip_fences(completion)
    program = assemble_program(prompt, completion, entry_point)
    own_lines = [line for line in code.splitlines() if line.strip()]
    if not own_lines or not compiles(program):
        return 0.0  # no style credit for nothing, or for text that is not Python
    first_own = program.count("\n", 0, len(program) - len(code)) + 1  # lines before it are the prompt's
    lines = program.splitlines(keepends=True)
    lines[-1] = lines[-1].rstrip("\n") + "\n"  # a missing final newline is the harness's, not a fault
    options = _style_options(max_line_length)
    report = _ErrorLines(options)
    pycodestyle.Checker(lines=lines, options=options, report=report).check_all()
    errors = sum(1 for line in report.lines if line >= first_own)
    return max(0.0, 1.0 - errors / len(own_lines))


def code_style(
    prompts: list[Any],
    completions: list[str],
    entry_point: list[str | None] | None = None,
    *,
    max_line_length: int = 79,
    **_: Any,
) -> list[float]:
    """pycodestyle on the completion's lines: max(0, 1 - errors / non-blank lines).

    Checked in place (after the prompt for a body) so indentation is judged correctly, counting
    only errors on the completion's own lines; pycodestyle's default ignore list applies.
    Empty or non-compiling completions score 0.

    >>> code_style(["def f(x):\\n"] * 2, ["    return x*2 if x>0 else 0\\n", "    y = x * 2\\n    return y\\n"],
    ...            entry_point=["f"] * 2)
    [0.0, 1.0]
    """
    entry_point = _column(entry_point, len(completions))
    return [_style_score(p, c, e, max_line_length) for p, c, e in zip(prompts, completions, entry_point)]


def _solution_tokens(text: str, prompt_lines: set[str]) -> list[str]:
    """Tokens of the lines that are not the prompt's (a copied signature is not copying)."""
    kept = [line for line in text.splitlines() if line.strip() and line.strip() not in prompt_lines]
    return TOKEN.findall("\n".join(kept))


def _ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    n = max(1, min(n, len(tokens)))
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def reference_overlap(prompt: Any, completion: str, reference: str, ngram: int = 4) -> float:
    """Share of the reference's token n-grams that reappear in the completion (0-1).

    Containment rather than Jaccard: padding a copied reference with extra code keeps it at 1.
    Lines that appear in the prompt are left out of both sides.

    >>> reference_overlap("", "a = b + d", "a = b + c"), reference_overlap("", "x = 1\\na = b + c", "a = b + c")
    (0.5, 1.0)
    """
    prompt_lines = {line.strip() for line in prompt_text(prompt).splitlines() if line.strip()}
    wanted = _ngrams(_solution_tokens(strip_fences(reference), prompt_lines), ngram)
    got = _solution_tokens(strip_fences(completion), prompt_lines)
    if not wanted or not got:
        return 0.0
    return len(wanted & _ngrams(got, ngram)) / len(wanted)


def code_similarity(
    prompts: list[Any],
    completions: list[str],
    reference: list[str | None],
    *,
    threshold: float = 0.8,
    ngram: int = 4,
    **_: Any,
) -> list[float]:
    """Anti-copying penalty: 0 up to `threshold` overlap with the reference solution, then down
    linearly to -1 at a verbatim copy: -(overlap - threshold) / (1 - threshold).

    Overlap is `reference_overlap` on token `ngram`-grams of capped input (never character-level
    difflib, which takes minutes on 40 KB). A short reference leaves little room for a different
    correct solution, so keep the weight small; renaming variables evades it.

    >>> code_similarity(["", "", ""], ["a = b + c", "a = b + d", ""], reference=["a = b + c"] * 3, threshold=0.0)
    [-1.0, -0.5, 0.0]
    """
    if not 0 <= threshold < 1:
        raise ValueError(f"code_similarity: threshold must be in [0, 1), got {threshold}")
    scores = []
    for prompt, completion, ref in zip(prompts, completions, reference):
        overlap = reference_overlap(prompt, completion, ref or "", ngram)
        scores.append(0.0 if overlap <= threshold else -(overlap - threshold) / (1 - threshold))
    return scores


# ---- unit tests in the sandbox -----------------------------------------------------------


class _Candidate:
    """What trusted test code sees as the candidate function: every call goes to the sandbox.

    A harness fault is remembered, so test code that swallows exceptions cannot hide it. So is
    the score at the first fatal failure (timeout, crash, flood, protocol): from then on every
    call raises, and a unit like `try: candidate(-1) except Exception: pass` (meant to check that
    the candidate raises) must not pass because the candidate hung or died instead.
    """

    def __init__(self, session: Any, name: str, progress: Callable[[], int] = lambda: 0) -> None:
        self._session = session
        self.__name__ = name
        self.fault: BaseException | None = None
        self.passed_before_death: int | None = None
        self._progress = progress

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from grpo_cli.rewards.code.sandbox import CandidateFailure, HarnessFault

        if self.fault is not None:
            raise self.fault
        try:
            return self._session.call(*args, **kwargs)
        except HarnessFault as err:
            self.fault = err
            raise
        except CandidateFailure as err:
            if err.kind != "raised" and self.passed_before_death is None:
                self.passed_before_death = self._progress()
            raise


def _run_check(sandbox: Any, program: str, entry_point: str, test: str) -> float:
    """HumanEval `check(candidate)`, exec'd here (trusted dataset code): the share of its
    assert-holding statements that pass (see `check_units`)."""
    source, units = check_units(test)
    namespace: dict[str, Any] = {PASSED: 0, "__name__": "__grpo_check__"}
    with sandbox.session(program, entry_point) as session:
        candidate = _Candidate(session, entry_point, lambda: namespace[PASSED])
        exec(compile(source, "<test>", "exec"), namespace)
        try:
            namespace["check"](candidate)
            returned = True
        except Exception:  # a failed setup statement: the units not reached count as failed
            returned = False
    if candidate.fault is not None:
        raise candidate.fault
    if candidate.passed_before_death is not None:  # units "passed" after the session died do not count
        return candidate.passed_before_death / units if units else 0.0
    return namespace[PASSED] / units if units else float(returned)


def _run_test_list(sandbox: Any, program: str, entry_point: str, asserts: list[str]) -> float:
    """MBPP asserts: (call, expected) pairs compared here with `strict_equal`; other asserts
    exec'd here with the entry point bound to the sandboxed candidate."""
    cases = parse_test_list(list(asserts), entry_point)
    passed = 0
    with sandbox.session(program, entry_point) as session:
        candidate = _Candidate(session, entry_point)
        for case in cases:
            try:
                if isinstance(case, CallCase):
                    passed += strict_equal(candidate(*case.args, **case.kwargs), case.expected)
                else:
                    exec(compile(case.source, "<test_list>", "exec"), {entry_point: candidate, "math": math})
                    passed += 1
            except Exception:  # CandidateFailure (this case fails) or a failed assert
                if candidate.fault is not None:
                    raise candidate.fault from None
    return passed / len(cases)


def _run_io(sandbox: Any, program: str, cases: list[dict[str, str]]) -> float:
    """Stdin/stdout pairs: the full list of normalised output lines must match, count included.
    A timeout ends the completion's turn (the cases left count as failed), so a hostile
    program costs one timeout, not one per case."""
    passed = 0
    for case in cases:
        result = sandbox.run_program(program, str(case.get("input", "")))
        if result.timed_out:
            break
        passed += result.exit_code == 0 and output_lines(result.stdout) == output_lines(str(case.get("output", "")))
    return passed / len(cases)


def _judge(sandbox: Any, program: str, entry_point: str | None, test: Any, test_list: Any, io: Any) -> float | None:
    """One completion's pass rate; 0 for whatever the candidate causes, None for a harness fault."""
    from grpo_cli.rewards.code.sandbox import CandidateFailure, HarnessFault

    try:
        if io:
            return _run_io(sandbox, program, list(io))
        if test:
            return _run_check(sandbox, program, str(entry_point), str(test))
        return _run_test_list(sandbox, program, str(entry_point), list(test_list))
    except HarnessFault:
        return None
    except CandidateFailure:  # could not start, died, timed out, broke the protocol
        return 0.0


def _run_batch(jobs: dict[int, Callable[[], float | None]], workers: int, deadline_s: float) -> dict[int, Any]:
    """Run the jobs on `workers` threads (each sandbox session is its own process) until the
    deadline. A job still running then scores 0 (it was slow); one never started gets None
    (the harness ran out of time, not the candidate's fault)."""
    results: dict[int, Any] = {}
    started: set[int] = set()

    def run(index: int) -> float | None:
        started.add(index)
        return jobs[index]()

    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="code-tests")
    futures = {pool.submit(run, i): i for i in jobs}
    end = time.monotonic() + deadline_s
    pending = set(futures)
    error: BaseException | None = None
    while pending:
        done, pending = wait(pending, timeout=max(0.0, end - time.monotonic()), return_when=FIRST_COMPLETED)
        for future in done:
            error = error or future.exception()
            results[futures[future]] = None if future.exception() else future.result()
        if time.monotonic() >= end:
            break
    for future in pending:
        index = futures[future]
        results[index] = 0.0 if index in started else None
    pool.shutdown(wait=False, cancel_futures=True)  # running sessions end on their own timeouts
    if error is not None:
        raise error  # a broken task (e.g. a `test` without check()) is the data's bug: say so loudly
    return results


def code_tests(
    prompts: list[Any],
    completions: list[str],
    entry_point: list[str | None] | None = None,
    test: list[str | None] | None = None,
    test_list: list[list[str] | None] | None = None,
    io: list[list[dict[str, str]] | None] | None = None,
    *,
    batch_timeout_s: float = BATCH_TIMEOUT_S,
    **settings: Any,
) -> list[float | None]:
    """Unit-test pass rate in the sandbox, 0-1, from whichever test shape the row has:
    `test` (share of check()'s assert statements that pass), `test_list` (share of asserts) or
    `io` (share of stdin/stdout cases). A row without tests scores None (nothing to judge).

    Source that does not compile scores 0 here without starting a process. The sandbox settings
    (`SandboxConfig`: backend, require_isolation, timeout_s, memory_mb, workers, prewarm) come
    from the config's `sandbox.*` section, overridden by the reward's own `kwargs`; completions
    run in parallel on `workers` threads, and the batch gets `batch_timeout_s` of wall clock in all.

    >>> code_tests(["def inc(x):\\n"], ["    return x +\\n"], entry_point=["inc"], test_list=[["assert inc(1) == 2"]])
    [0.0]
    """
    n = len(completions)
    entry_point, test, test_list, io = (_column(c, n) for c in (entry_point, test, test_list, io))
    scores: list[float | None] = [None] * n
    jobs: dict[int, Callable[[], float | None]] = {}
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        if not (test[i] or test_list[i] or io[i]):
            continue  # None: the data gives nothing to judge
        if (test[i] or test_list[i]) and not entry_point[i]:
            raise ValueError(f"code_tests: row {i} has function tests but no entry_point")
        program = assemble_program(prompt, completion, entry_point[i] if not io[i] else None)
        if not strip_fences(completion).strip() or not compiles(program):
            scores[i] = 0.0  # the candidate's fault, known without running anything
            continue
        jobs[i] = lambda i=i, program=program: _judge(sandbox, program, entry_point[i], test[i], test_list[i], io[i])
    if not jobs:
        return scores
    from grpo_cli.rewards.code.sandbox import HarnessFault

    try:
        sandbox = _sandbox(**settings)
    except HarnessFault:
        return scores  # the sandbox cannot start: every sample that needed it is unscored (None)
    # No more sessions at once than the sandbox's workers: RLIMIT_NPROC is shared by all of them.
    for index, value in _run_batch(jobs, sandbox.workers, batch_timeout_s).items():
        scores[index] = value
    return scores


def _code_tests_diagnostics(**settings: Any) -> dict[str, Any]:
    """Start-up diagnostics: builds the sandbox now, so its backend is known (and shown) before the
    first batch, and require_isolation refuses to start rather than scoring None for ever."""
    return {"sandbox_backend": sandbox_backend(**settings)}


code_tests.diagnostics = _code_tests_diagnostics  # type: ignore[attr-defined]
code_tests.takes_sandbox_settings = True  # type: ignore[attr-defined]  # `sandbox.*` fills its kwargs
