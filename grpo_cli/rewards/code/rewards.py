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
import builtins
import dataclasses
import functools
import math
import random
import re
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from grpo_cli.config.schema import SandboxConfig
from grpo_cli.rewards.code.tasks import (
    EQUAL,
    REMOTE,
    TALLY,
    CallCase,
    UnitTally,
    assemble_program,
    check_units,
    compiles,
    output_lines,
    parse_test_list,
    prompt_definitions,
    prompt_text,
    reaches_into_interpreter,
    strict_equal,
    strip_fences,
    test_setup,
)
from grpo_cli.rewards.rows import score_each

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
) -> list[float | None]:
    """1.0 when the program (prompt + completion when the completion is a function body) compiles.

    Nothing runs: `compile()` on the fence-stripped source, capped at 100k characters. An empty
    completion scores 0, or the prompt's signature and docstring alone would earn the point.

    >>> code_compiles(["def inc(x):\\n"] * 3, ["    return x + 1\\n", "    return x +\\n", ""], entry_point=["inc"] * 3)
    [1.0, 0.0, 0.0]
    """
    entry_point = _column(entry_point, len(completions))
    return score_each(
        lambda p, c, e: float(bool(strip_fences(c).strip()) and compiles(assemble_program(p, c, e))),
        prompts,
        completions,
        entry_point,
    )


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
    try:
        pycodestyle.Checker(lines=lines, options=options, report=report).check_all()
    except Exception:  # pycodestyle's own crash (IndexError on a lone string prefix such as `B #x`)
        return 0.0  # no style credit for what the checker cannot read, as for text that is not Python
    errors = sum(1 for line in report.lines if line >= first_own)
    return max(0.0, 1.0 - errors / len(own_lines))


def code_style(
    prompts: list[Any],
    completions: list[str],
    entry_point: list[str | None] | None = None,
    *,
    max_line_length: int = 79,
    **_: Any,
) -> list[float | None]:
    """pycodestyle on the completion's lines: max(0, 1 - errors / non-blank lines).

    Checked in place (after the prompt for a body) so indentation is judged correctly, counting
    only errors on the completion's own lines; pycodestyle's default ignore list applies.
    Empty or non-compiling completions score 0.

    >>> code_style(["def f(x):\\n"] * 2, ["    return x*2 if x>0 else 0\\n", "    y = x * 2\\n    return y\\n"],
    ...            entry_point=["f"] * 2)
    [0.0, 1.0]
    """
    entry_point = _column(entry_point, len(completions))
    return score_each(lambda p, c, e: _style_score(p, c, e, max_line_length), prompts, completions, entry_point)


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
) -> list[float | None]:
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

    def penalty(prompt: Any, completion: str, ref: str | None) -> float:
        overlap = reference_overlap(prompt, completion, ref or "", ngram)
        return 0.0 if overlap <= threshold else -(overlap - threshold) / (1 - threshold)

    return score_each(penalty, prompts, completions, reference)


# ---- unit tests in the sandbox -----------------------------------------------------------

# The dataset columns code_tests and code_efficiency read (code_efficiency also `reference`).
TASK_COLUMNS = ("entry_point", "test", "test_list", "io", "test_setup_code", "test_imports", "challenge_test_list")
CODE_TEST_MODES = ("fraction", "all")  # code_tests kwargs.mode: share of units passed | 1 only if all pass
VERDICT_MEMO_SIZE = 4096  # recent code_tests verdicts code_efficiency reuses (it skips failing completions)


@dataclass(frozen=True)
class Task:
    """One row's tests in whichever public shape it has, as the sandbox runs them."""

    prompt: Any
    entry_point: str | None
    test: str | None  # HumanEval check(candidate)
    test_list: tuple[str, ...]  # MBPP asserts, challenge_test_list included
    io: tuple[tuple[str, str], ...]  # (stdin, expected stdout) pairs
    setup: str  # MBPP test_imports + test_setup_code: before the candidate, and before the asserts

    @classmethod
    def from_row(cls, prompt: Any, entry_point: Any, test: Any, test_list: Any, io: Any, row: dict[str, Any]) -> Task:
        asserts = [*(test_list or []), *(row.get("challenge_test_list") or [])]
        pairs = tuple((str(c.get("input", "")), str(c.get("output", ""))) for c in (io or []))
        setup = test_setup(row.get("test_setup_code"), row.get("test_imports"))
        return cls(prompt, entry_point or None, test or None, tuple(map(str, asserts)), pairs, setup)

    @property
    def runnable(self) -> bool:
        return bool(self.test or self.test_list or self.io)

    def program(self, code: str) -> str:
        return assemble_program(self.prompt, code, None if self.io else self.entry_point)

    def key(self) -> tuple[Any, ...]:
        return (prompt_definitions(self.prompt), self.entry_point, self.test, self.test_list, self.io, self.setup)

    def empty_body(self) -> str:
        """What an empty body amounts to: a function that returns None, or a program that prints nothing."""
        return self.program("pass\n" if self.io else f"def {self.entry_point}(*args, **kwargs):\n    return None\n")


@dataclass(frozen=True)
class Verdict:
    """What one program did on its task's tests: `passed` of `units` counted units; `finished`
    when the tests ran to their end; `cost`, when counted, the bytecode instructions executed;
    `passed_units`, the positions of the units passed (see `UnitTally`)."""

    passed: int
    units: int
    finished: bool
    cost: int | None = None
    passed_units: frozenset[int] = frozenset()

    @property
    def all_passed(self) -> bool:
        return self.finished and self.units > 0 and self.passed == self.units

    def score(self, mode: str, empty_body_passes: frozenset[int] = frozenset()) -> float:
        """A unit an empty body passes (`candidate([]) is None` when the function returns None)
        does not count on its own: with no unit passed beyond those, the score is 0, so an
        empty body scores exactly 0 and a completion that only returns None earns nothing.

        >>> Verdict(3, 6, True, passed_units=frozenset({0, 1, 2})).score("fraction", frozenset({0, 1, 2}))
        0.0
        >>> Verdict(4, 6, True, passed_units=frozenset({0, 1, 2, 3})).score("fraction", frozenset({0, 1, 2}))
        0.6666666666666666
        """
        if self.passed_units and self.passed_units <= empty_body_passes:
            return 0.0
        if mode == "all":
            return float(self.all_passed)
        return self.passed / self.units if self.units else 0.0


FAILED = Verdict(0, 1, False)  # whatever the candidate caused before any unit could run


def _private_random(seed: int = 0) -> types.ModuleType:
    """A `random` module of its own, seeded: a check that draws random inputs draws the same ones
    on every run (so scores repeat, and the reference meets the candidate's inputs), and never
    moves the trainer's global generator."""
    rng = random.Random(seed)
    module = types.ModuleType("random")
    for name in dir(random):
        attr = getattr(random, name)
        bound_to_global = getattr(attr, "__self__", None) is getattr(random, "_inst", None)
        setattr(module, name, getattr(rng, name) if bound_to_global else attr)
    return module


@lru_cache(maxsize=4096)
def _compiled(source: str, filename: str) -> types.CodeType:
    """Trusted test code compiled once: the same tasks are judged G completions at a time."""
    return compile(source, filename, "exec")


def _trusted_namespace(definitions: str) -> dict[str, Any]:
    """Globals for trusted test code: strict `==`, a private seeded `random`, and `definitions`
    (the prompt's helpers, the task's set-up) already run. The dataset's bug if they raise."""
    private = _private_random()
    real_import = builtins.__import__

    def import_(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name == "random" and level == 0:
            return private
        return real_import(name, globals, locals, fromlist, level)

    namespace: dict[str, Any] = {
        "__builtins__": {**vars(builtins), "__import__": import_},
        "__name__": "__grpo_check__",
        EQUAL: strict_equal,
        "math": math,  # MBPP asserts use math.isclose with the reference's own `import math` in scope
    }
    if definitions.strip():
        exec(_compiled(definitions, "<task definitions>"), namespace)
    return namespace


class _Candidate:
    """What trusted test code sees as the candidate function: every call goes to the sandbox, and
    is counted in the tally (a unit without one is not a unit).

    A harness fault is remembered, so test code that swallows exceptions cannot hide it. So is
    the units passed at the first fatal failure (timeout, crash, flood, protocol): from then on
    every call raises, and a unit like `try: candidate(-1) except Exception: pass` (meant to check
    that the candidate raises) must not pass because the candidate hung or died instead.
    """

    def __init__(self, session: Any, name: str, tally: UnitTally) -> None:
        self._session = session
        self.__name__ = name
        self.fault: BaseException | None = None
        self.passed_before_death: int | None = None
        self.passed_units_before_death: frozenset[int] = frozenset()
        self._tally = tally

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._send(lambda: self._session.call(*args, **kwargs))

    def remote(self, expression: str) -> Any:
        return self._send(lambda: self._session.evaluate(expression))

    def _send(self, request: Callable[[], Any]) -> Any:
        from grpo_cli.rewards.code.sandbox import CandidateFailure, HarnessFault

        self._tally.called()
        if self.fault is not None:
            raise self.fault
        try:
            return request()
        except HarnessFault as err:
            self.fault = err
            raise
        except CandidateFailure as err:
            if err.kind != "raised" and self.passed_before_death is None:
                self.passed_before_death = self._tally.passed
                self.passed_units_before_death = frozenset(self._tally.passed_units)
            raise


def _run_check(sandbox: Any, task: Task, program: str, count: bool) -> Verdict:
    """HumanEval `check(candidate)`, exec'd here (trusted dataset code) with the prompt's helpers
    in scope and the entry point's own name bound to the candidate (see `check_units`)."""
    source, units = check_units(str(task.test))
    tally = UnitTally()
    namespace = _trusted_namespace(f"{task.setup}\n{prompt_definitions(task.prompt)}")
    with sandbox.session(program, task.entry_point, task.setup, count) as session:
        candidate = _Candidate(session, str(task.entry_point), tally)
        namespace.update({TALLY: tally, str(task.entry_point): candidate})
        exec(_compiled(source, "<test>"), namespace)
        try:
            namespace["check"](candidate)
            finished = True
        except Exception:  # a failed set-up statement: the units not reached count as failed
            finished = False
    if candidate.fault is not None:
        raise candidate.fault
    counted = units - tally.idle
    if candidate.passed_before_death is not None:  # units "passed" after the session died do not count
        return Verdict(candidate.passed_before_death, max(counted, 1), False, None, candidate.passed_units_before_death)
    if counted <= 0:  # no unit exercised it: returning after calling it at all is the one unit
        return Verdict(int(finished and tally.calls > 0), 1, finished, session.cost if count else None)
    return Verdict(tally.passed, counted, finished, session.cost if count else None, frozenset(tally.passed_units))


def _run_test_list(sandbox: Any, task: Task, program: str, count: bool) -> Verdict:
    """MBPP asserts: (call, expected) pairs compared here with `strict_equal`; other asserts
    exec'd here after the set-up code, `==` strict, the entry point's calls evaluated in the
    sandbox. An assert that never calls the candidate is not counted."""
    entry_point = str(task.entry_point)
    cases = parse_test_list(task.test_list, entry_point)
    tally = UnitTally()
    namespace = _trusted_namespace(task.setup)
    with sandbox.session(program, entry_point, task.setup, count) as session:
        candidate = _Candidate(session, entry_point, tally)
        namespace.update({entry_point: candidate, REMOTE: candidate.remote})
        for case in cases:
            try:
                if isinstance(case, CallCase):
                    passed = strict_equal(candidate(*case.args, **case.kwargs), case.expected)
                else:
                    exec(_compiled(case.code, "<test_list>"), namespace)
                    passed = True
            except Exception:  # CandidateFailure (this case fails) or a failed assert
                if candidate.fault is not None:
                    raise candidate.fault from None
                passed = False
            tally.unit(passed)
    counted = len(cases) - tally.idle
    return Verdict(tally.passed, max(counted, 1), True, session.cost if count else None, frozenset(tally.passed_units))


def _run_io(sandbox: Any, task: Task, program: str, count: bool) -> Verdict:
    """Stdin/stdout pairs: the full list of normalised output lines must match, count included.
    A timeout ends the completion's turn (the cases left count as failed), so a hostile
    program costs one timeout, not one per case."""
    passed_units, costs = set(), []
    for unit, (stdin, expected) in enumerate(task.io):
        result = sandbox.run_program(program, stdin, count)
        if result.timed_out:
            break
        if result.exit_code == 0 and output_lines(result.stdout) == output_lines(expected):
            passed_units.add(unit)
        costs.append(result.cost)
    counted = None if not count or None in costs else sum(costs)
    return Verdict(len(passed_units), len(task.io), True, counted, frozenset(passed_units))


def _judge(sandbox: Any, task: Task, program: str, count: bool = False) -> Verdict | None:
    """One program's verdict; whatever the candidate causes fails it, a harness fault gives None."""
    from grpo_cli.rewards.code.sandbox import CandidateFailure, HarnessFault

    try:
        if task.io:
            return _run_io(sandbox, task, program, count)
        if task.test:
            return _run_check(sandbox, task, program, count)
        return _run_test_list(sandbox, task, program, count)
    except HarnessFault:
        return None
    except CandidateFailure:  # could not start, died, timed out, broke the protocol
        return FAILED


class _VerdictMemo:
    """The last few thousand verdicts, by (sandbox settings, program, task): code_efficiency reads
    code_tests' verdicts of the same batch and does not run a completion that failed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], Verdict] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> Verdict | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple[Any, ...], verdict: Verdict) -> None:
        with self._lock:
            self._items[key] = verdict
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_VERDICTS = _VerdictMemo(VERDICT_MEMO_SIZE)
_EMPTY_BODY_PASSES: dict[tuple[Any, ...], frozenset[int]] = {}  # (settings, task) -> units an empty body passes
_EMPTY_BODY_LOCK = threading.Lock()


def _empty_body_passes(sandbox: Any, key: tuple[Any, ...], task: Task) -> frozenset[int] | None:
    """The units of `task` an empty body passes, judged once per task and process (one session);
    None on a harness fault (tried again next time)."""
    with _EMPTY_BODY_LOCK:
        if key in _EMPTY_BODY_PASSES:
            return _EMPTY_BODY_PASSES[key]
    verdict = _judge(sandbox, task, task.empty_body())
    if verdict is None:
        return None
    with _EMPTY_BODY_LOCK:
        _EMPTY_BODY_PASSES[key] = verdict.passed_units
    return verdict.passed_units


def _tasks(
    prompts: list[Any], n: int, entry_point: Any, test: Any, test_list: Any, io: Any, columns: dict[str, Any]
) -> list[Task]:
    entry_point, test, test_list, io = (_column(c, n) for c in (entry_point, test, test_list, io))
    extra = {name: _column(columns.get(name), n) for name in ("challenge_test_list", "test_setup_code", "test_imports")}
    tasks = []
    for i in range(n):
        row = {name: values[i] for name, values in extra.items()}
        task = Task.from_row(prompts[i], entry_point[i], test[i], test_list[i], io[i], row)
        if (task.test or task.test_list) and not task.io and not task.entry_point:
            raise ValueError(f"code tests: row {i} has function tests but no entry_point")
        tasks.append(task)
    return tasks


def _check_mode(mode: str) -> None:
    if mode not in CODE_TEST_MODES:
        raise ValueError(f"code_tests kwargs.mode={mode!r}: expected one of {', '.join(CODE_TEST_MODES)}")


def _run_batch(jobs: dict[int, Callable[[], float | None]], workers: int, deadline_s: float) -> dict[int, Any]:
    """Run the jobs on `workers` threads (each sandbox session is its own process) until the
    deadline. A job still running then scores 0 (it was slow), and so does one never started:
    the time went to its batch's slow candidates, and a None would drop code_tests from that
    completion's fused mean only, so a wrong answer queued behind hangs would outscore them."""
    results: dict[int, Any] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="code-tests")
    futures = {pool.submit(job): i for i, job in jobs.items()}
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
        results[futures[future]] = 0.0  # started or not: never None, which only a harness fault gives
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
    tasks = _tasks(prompts, n, entry_point, test, test_list, io, settings)
    scores: list[float | None] = [None] * n
    jobs: dict[int, Callable[[Any], float | None]] = {}
    key = _settings_key(settings)
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        if not task.runnable:
            continue  # None: the data gives nothing to judge
        program = task.program(completion)
        if not strip_fences(completion).strip() or not compiles(program):
            scores[i] = 0.0  # the candidate's fault, known without running anything
            continue

        def job(sandbox: Any, task: Task = task, program: str = program) -> float | None:
            verdict = _judge(sandbox, task, program)
            if verdict is None:
                return None
            _VERDICTS.put((key, program, task.key()), verdict)
            if not verdict.passed_units:
                return verdict.score(mode)
            empty_body = _empty_body_passes(sandbox, (key, task.key()), task)  # what passing without code earns
            return None if empty_body is None else verdict.score(mode, empty_body)

        jobs[i] = job
    return _score_jobs(scores, jobs, settings, batch_timeout_s)


def _settings_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(settings.get(f.name) for f in dataclasses.fields(SandboxConfig))


def _score_jobs(
    scores: list[float | None],
    jobs: dict[int, Callable[[Any], float | None]],
    settings: dict[str, Any],
    deadline_s: float,
) -> list[float | None]:
    """Fill `scores` from `jobs`, each called with the sandbox built from `settings`; all unscored
    (None) if the sandbox cannot start."""
    if not jobs:
        return scores
    from grpo_cli.rewards.code.sandbox import HarnessFault

    try:
        sandbox = _sandbox(**settings)
    except HarnessFault:
        return scores  # the sandbox cannot start: every sample that needed it is unscored (None)
    # No more sessions at once than the sandbox's workers: RLIMIT_NPROC is shared by all of them.
    bound = {i: functools.partial(job, sandbox) for i, job in jobs.items()}
    for index, value in _run_batch(bound, sandbox.workers, deadline_s).items():
        scores[index] = value
    return scores


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


def _reference_cost(sandbox: Any, key: tuple[Any, ...], task: Task, reference: str) -> int | None:
    """Instructions the reference solution executes on the task's tests, once per task and
    process; None when the reference does not pass them itself (then nothing is measured)."""
    with _REFERENCE_LOCK:
        if key in _REFERENCE_COSTS:
            return _REFERENCE_COSTS[key]
    verdict = _judge(sandbox, task, task.program(reference), count=True)
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
    tasks = _tasks(prompts, n, entry_point, test, test_list, io, settings)
    references = _column(reference, n)
    scores: list[float | None] = [None] * n
    jobs: dict[int, Callable[[Any], float | None]] = {}
    key = _settings_key(settings)
    for i, (task, completion, ref) in enumerate(zip(tasks, completions, references)):
        if not task.runnable or not ref:
            continue
        code = strip_fences(completion)
        program = task.program(completion)
        known = _VERDICTS.get((key, program, task.key()))
        if not code.strip() or not compiles(program) or (known is not None and not known.all_passed):
            scores[i] = 0.0
            continue
        if reaches_into_interpreter(code):
            scores[i] = 0.0
            continue

        def job(sandbox: Any, task: Task = task, program: str = program, ref: str = ref) -> float | None:
            reference_cost = _reference_cost(sandbox, (key, ref, task.key()), task, ref)
            if reference_cost is None:
                return None
            verdict = _judge(sandbox, task, program, count=True)
            if verdict is None:
                return None
            if not verdict.all_passed or verdict.cost is None:
                return 0.0
            return efficiency(reference_cost, verdict.cost)

        jobs[i] = job
    return _score_jobs(scores, jobs, settings, batch_timeout_s)


code_efficiency.diagnostics = _code_tests_diagnostics  # type: ignore[attr-defined]  # the same sandbox
code_efficiency.takes_sandbox_settings = True  # type: ignore[attr-defined]
