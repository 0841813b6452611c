"""The judge: runs a task's trusted tests against one program in the sandbox and returns its
`Verdict` (docs/architecture.md §5). The tests run here, in the trusted parent; only calls of the
candidate go into the sandbox, and their strict values are compared here with expectations it
never sees."""

from __future__ import annotations

import builtins
import dataclasses
import math
import random
import reprlib
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from grpo_cli.rewards.code.checks import (
    EQUAL,
    REMOTE,
    TALLY,
    CallCase,
    UnitTally,
    check_units,
    output_lines,
    parse_test_list,
    strict_equal,
    test_setup,
    unit_sources,
)
from grpo_cli.rewards.code.faults import CandidateFailure, HarnessFault
from grpo_cli.rewards.code.tasks import assemble_program, column, prompt_definitions


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


def tasks_from_columns(
    prompts: list[Any], n: int, entry_point: Any, test: Any, test_list: Any, io: Any, columns: dict[str, Any]
) -> list[Task]:
    """The batch's tasks, one per row, from the reward's data columns (`columns` holds the rest)."""
    entry_point, test, test_list, io = (column(c, n) for c in (entry_point, test, test_list, io))
    extra = {name: column(columns.get(name), n) for name in ("challenge_test_list", "test_setup_code", "test_imports")}
    tasks = []
    for i in range(n):
        row = {name: values[i] for name, values in extra.items()}
        task = Task.from_row(prompts[i], entry_point[i], test[i], test_list[i], io[i], row)
        if (task.test or task.test_list) and not task.io and not task.entry_point:
            raise ValueError(f"code tests: row {i} has function tests but no entry_point")
        if task.test and not task.io:
            try:  # the data's bug, said before anything runs (a job's error leaves only its row unscored)
                check_units(task.test)
            except (ValueError, SyntaxError) as err:
                raise ValueError(f"code tests: row {i}'s test: {err}") from None
        tasks.append(task)
    return tasks


@dataclass(frozen=True)
class Verdict:
    """What one program did on its task's tests: `passed` of `units` counted units; `finished`
    when the tests ran to their end; `cost`, when counted, the bytecode instructions executed;
    `passed_units`, the positions of the units passed (see `UnitTally`); `failure`, what went
    wrong first, as feedback for the model (env=code_feedback): the failing test, what the
    function raised (with its own lines) or returned, what it printed. Never part of a score."""

    passed: int
    units: int
    finished: bool
    cost: int | None = None
    passed_units: frozenset[int] = frozenset()
    failure: str = field(default="", compare=False)

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
FEEDBACK_CHARS = 400  # of each untrusted part of a failure (a value, a message, the output)


class _Shown(reprlib.Repr):
    """repr, cut to a few items per container and FEEDBACK_CHARS per string: an int over Python's
    digit limit for str() (10**20000) is described, not printed (its repr raises ValueError)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 4, 12, 12, 12, 12
        self.maxstring, self.maxother, self.maxlong = FEEDBACK_CHARS, FEEDBACK_CHARS, 100

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 1000:  # ~300 digits: beyond what feedback can usefully show
            return f"<an int of about {int(x.bit_length() * math.log10(2)) + 1} digits>"
        return super().repr_int(x, level)


_SHOWN = _Shown()


def shown(value: Any) -> str:
    """What a candidate's function returned, as at most FEEDBACK_CHARS of text, whatever it is:
    the sandbox's strict values can be too big to print, and feedback must never fail a batch.

    >>> shown(10**20000), shown([1] * 50)
    ('<an int of about 20001 digits>', '[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ...]')
    """
    try:
        return _SHOWN.repr(value)[:FEEDBACK_CHARS]
    except Exception as err:  # anything a value's repr raises: describe the value instead
        return f"<a {type(value).__name__} that cannot be printed: {type(err).__name__}>"


def describe_failure(
    test: str | None, error: CandidateFailure | None = None, got: Any = None, printed: str = "", stopped: bool = False
) -> str:
    """A failure in the words a developer would want back: the test, then why it failed.

    >>> print(describe_failure("assert add(2, 3) == 5", got=6, printed="adding"))
    The first failing test: assert add(2, 3) == 5
    Your function returned: 6
    It printed: adding
    """
    if test:
        lines = [f"The first failing test: {test[:FEEDBACK_CHARS]}"]
    else:
        lines = ["Your code failed before any test ran." if error is not None else "The tests did not finish."]
    if error is not None:
        lines.append(
            f"It failed with {str(error)[:FEEDBACK_CHARS]}"
            if error.kind != "raised"
            else f"It raised {str(error)[:FEEDBACK_CHARS]}"
        )
        if error.trace:
            lines.append(f"Traceback (your code, most recent call last):\n{error.trace[-FEEDBACK_CHARS * 2 :]}")
    elif got is not None:
        lines.append(f"Your function returned: {shown(got)}")
    elif stopped:
        lines.append("It crashed, timed out or exited before the tests finished.")
    if printed.strip():
        lines.append(f"It printed: {printed.strip()[-FEEDBACK_CHARS:]}")
    return "\n".join(lines)


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
        self.errors: dict[int, CandidateFailure] = {}  # the first failure in each unit, by position
        self._tally = tally

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._send(lambda: self._session.call(*args, **kwargs))

    def remote(self, expression: str) -> Any:
        return self._send(lambda: self._session.evaluate(expression))

    def _send(self, request: Callable[[], Any]) -> Any:
        self._tally.called()
        if self.fault is not None:
            raise self.fault
        try:
            return request()
        except HarnessFault as err:
            self.fault = err
            raise
        except CandidateFailure as err:
            self.errors.setdefault(self._tally.position, err)
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
    failed = tally.first_failed
    sources = unit_sources(str(task.test))
    error = candidate.errors.get(failed) if failed is not None else next(iter(candidate.errors.values()), None)
    failure = describe_failure(
        sources[failed] if failed is not None and failed < len(sources) else None,
        error, printed=session.printed, stopped=not finished,
    )  # fmt: skip
    counted = units - tally.idle
    if candidate.passed_before_death is not None:  # units "passed" after the session died do not count
        dead = (candidate.passed_before_death, max(counted, 1), False, None, candidate.passed_units_before_death)
        return Verdict(*dead, failure=failure)
    if counted <= 0:  # no unit exercised it: returning after calling it at all is the one unit
        return Verdict(int(finished and tally.calls > 0), 1, finished, session.cost if count else None, failure=failure)
    passed_units = frozenset(tally.passed_units)
    return Verdict(tally.passed, counted, finished, session.cost if count else None, passed_units, failure)


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
        returned: dict[int, Any] = {}  # what a (call, expected) case got, by position
        for position, case in enumerate(cases):
            try:
                if isinstance(case, CallCase):
                    returned[position] = candidate(*case.args, **case.kwargs)
                    passed = strict_equal(returned[position], case.expected)
                else:
                    exec(_compiled(case.code, "<test_list>"), namespace)
                    passed = True
            except Exception:  # CandidateFailure (this case fails) or a failed assert
                if candidate.fault is not None:
                    raise candidate.fault from None
                passed = False
            tally.unit(passed)
    failed = tally.first_failed
    failure = "" if failed is None else describe_failure(
        task.test_list[failed], candidate.errors.get(failed), returned.get(failed), session.printed
    )  # fmt: skip
    counted = len(cases) - tally.idle
    passed_units = frozenset(tally.passed_units)
    return Verdict(tally.passed, max(counted, 1), True, session.cost if count else None, passed_units, failure)


def _run_io(sandbox: Any, task: Task, program: str, count: bool) -> Verdict:
    """Stdin/stdout pairs: the full list of normalised output lines must match, count included.
    A timeout ends the completion's turn (the cases left count as failed), so a hostile
    program costs one timeout, not one per case."""
    passed_units, costs, failure = set(), [], ""
    for unit, (stdin, expected) in enumerate(task.io):
        result = sandbox.run_program(program, stdin, count)
        if not result.timed_out and result.exit_code == 0 and output_lines(result.stdout) == output_lines(expected):
            passed_units.add(unit)
        elif not failure:
            failure = _io_failure(stdin, expected, result)
        if result.timed_out:
            break
        costs.append(result.cost)
    counted = None if not count or None in costs else sum(costs)
    return Verdict(len(passed_units), len(task.io), True, counted, frozenset(passed_units), failure)


def _io_failure(stdin: str, expected: str, result: Any) -> str:
    """A failing stdin/stdout case: its input, the output expected and the output got, and the
    end of stderr (a traceback) when the program failed."""
    n = FEEDBACK_CHARS
    lines = [f"The first failing case: input {stdin[:n]!r}, expected output {expected[:n]!r}"]
    if result.timed_out:
        lines.append("Your program timed out on it.")
    else:
        lines.append(f"Your program printed {result.stdout[:n]!r} and exited with status {result.exit_code}.")
    if result.stderr.strip():
        lines.append(f"Its stderr ended with:\n{result.stderr.strip()[-n * 2 :]}")
    return "\n".join(lines)


def judge(sandbox: Any, task: Task, program: str, count: bool = False) -> Verdict | None:
    """One program's verdict; whatever the candidate causes fails it, a harness fault gives None."""
    try:
        if task.io:
            return _run_io(sandbox, task, program, count)
        if task.test:
            return _run_check(sandbox, task, program, count)
        return _run_test_list(sandbox, task, program, count)
    except HarnessFault:
        return None
    except CandidateFailure as err:  # could not start, died, timed out, broke the protocol
        return dataclasses.replace(FAILED, failure=describe_failure(None, err))


class VerdictMemo:
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
