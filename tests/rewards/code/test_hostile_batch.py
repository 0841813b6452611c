"""Issue 52 item 7: a completion's output never costs another row its score. Hostile completions
(huge ints, non-UTF-8 output, output floods, fork bombs, values that cannot be shown or serialised)
are scored in ONE batch beside honest ones, through `code_tests` and `code_efficiency` as the
trainer calls them, on the isolated backends: bwrap (what CI installs; GRPO_REQUIRE_ISOLATED_SANDBOX=1
makes it fail instead of skip) and unshare (no bubblewrap). Each hostile row scores 0, each honest
row scores 1, never None."""

from __future__ import annotations

import json
import math
from importlib.resources import files

import pytest

from grpo_cli.rewards.code import HarnessFault
from grpo_cli.rewards.code.batch import run_batch, sandbox_for
from grpo_cli.rewards.code.judge import describe_failure
from grpo_cli.rewards.code.sandboxed_rewards import TASK_COLUMNS, code_efficiency, code_tests
from tests.rewards.code.conftest import REQUIRED_BACKENDS, isolation_missing

TASKS = [json.loads(line) for line in (files("grpo_cli.data") / "code_tasks.jsonl").read_text().splitlines()]
FUNCTION = next(t for t in TASKS if t["entry_point"] == "triangle")  # MBPP asserts, compared in the parent
CHECK = next(t for t in TASKS if t["entry_point"] == "digital_root")  # HumanEval check(candidate)
IO = next(t for t in TASKS if t["io"] is not None and t["reference"].startswith("print"))  # stdin/stdout
# a unique timeout: a fresh sandbox of this module's own, so the fork bomb meets nobody else's runners
SETTINGS = {"timeout_s": 1.25, "workers": 2}

HUGE = "def {f}(*args, **kwargs):\n    return 10**20000\n"  # issue 52: voided the whole batch
HOSTILE_FUNCTIONS = {
    "huge int": HUGE,
    "huge negative int in a list": "def {f}(*args, **kwargs):\n    return [-(7**40000)]\n",
    "non-UTF-8 output, then a huge int": (
        "import sys\ndef {f}(*args, **kwargs):\n    sys.stdout.buffer.write(b'\\xff\\xfe\\x80 bad')\n"
        "    sys.stdout.flush()\n    return 10**5000\n"
    ),
    "lone surrogate": "def {f}(*args, **kwargs):\n    return '\\ud800'\n",
    "non-UTF-8 exception text": (
        "def {f}(*args, **kwargs):\n    raise ValueError(b'\\xff\\xfe'.decode('latin-1') * 10**5)\n"
    ),
    "nan": "def {f}(*args, **kwargs):\n    return float('nan')\n",
    "stdout flood": "def {f}(*args, **kwargs):\n    while True:\n        print('x' * 10_000)\n",
    "fork bomb": (
        "import os\ndef {f}(*args, **kwargs):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    ),
}
HOSTILE_PROGRAMS = {
    "non-UTF-8 output": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x80\\n')\n",
    "a huge number printed": "import sys\nsys.set_int_max_str_digits(0)\nprint(10**20000)\n",
    "stdout flood": "while True:\n    print('5' * 4096)\n",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
}


def _columns(tasks: list[dict]) -> dict[str, list]:
    return {k: [t.get(k) for t in tasks] for k in TASK_COLUMNS}


@pytest.fixture(params=["bwrap", "unshare"])
def backend(request) -> str:
    """The backend, or a skip (bwrap under CI: a failure) where it does not work here."""
    try:
        sandbox_for(backend=request.param, **SETTINGS)
    except HarnessFault as err:  # this machine cannot run it
        message = f"the {request.param} sandbox does not work on this machine: {err}"
        if request.param in REQUIRED_BACKENDS:
            isolation_missing(message)
        pytest.skip(message)
    return request.param


def test_hostile_completions_score_zero_and_cost_the_honest_rows_nothing(backend: str) -> None:
    functions = [FUNCTION] * len(HOSTILE_FUNCTIONS) + [CHECK] * 2
    programs = [IO] * len(HOSTILE_PROGRAMS)
    hostile = [code.format(f=t["entry_point"]) for code, t in zip(HOSTILE_FUNCTIONS.values(), functions)]
    hostile += [
        HUGE.format(f="digital_root"),
        HOSTILE_FUNCTIONS["non-UTF-8 output, then a huge int"].format(f="digital_root"),
    ]
    hostile += list(HOSTILE_PROGRAMS.values())
    honest_tasks = [FUNCTION, CHECK, IO]
    tasks = [*honest_tasks, *functions, *programs, *honest_tasks]  # honest rows first and last
    honest = [t["reference"] for t in honest_tasks]
    completions = [*honest, *hostile, *honest]
    scores = code_tests([t["prompt"] for t in tasks], completions, **_columns(tasks), backend=backend, **SETTINGS)
    names = (
        ["honest"] * 3 + [*HOSTILE_FUNCTIONS, "check: huge int", "check: non-UTF-8", *HOSTILE_PROGRAMS] + ["honest"] * 3
    )
    assert dict(enumerate(zip(names, scores))) == {
        i: (name, 1.0 if name == "honest" else 0.0) for i, name in enumerate(names)
    }


def test_a_huge_int_beside_an_honest_completion_leaves_its_efficiency(backend: str) -> None:
    """The issue's pair: a completion returning 10**20000 and an honest one, both None before."""
    tasks = [FUNCTION, FUNCTION]
    completions = [HUGE.format(f="triangle"), FUNCTION["reference"]]
    prompts, columns = [t["prompt"] for t in tasks], _columns(tasks)
    assert code_tests(prompts, completions, **columns, backend=backend, **SETTINGS) == [0.0, 1.0]
    reference = [FUNCTION["reference"]] * 2
    assert code_efficiency(prompts, completions, reference, **columns, backend=backend, **SETTINGS) == [0.0, 1.0]


@pytest.mark.parametrize(
    "value",
    [10**20000, [[-(7**40000)]], float("nan"), "\ud800" * 3, b"\xff" * 10**6],
    ids=["huge-int", "nested-huge-int", "nan", "surrogates", "a-megabyte"],
)
def test_feedback_shows_any_value_the_sandbox_returns_in_a_bounded_line(value: object) -> None:
    """env=code_feedback shows the returned value: one that cannot be printed is described instead."""
    text = describe_failure("assert f(1) == 2", got=value)
    assert text.startswith("The first failing test: assert f(1) == 2\nYour function returned: ")
    assert len(text) < 600 and (not isinstance(value, float) or math.isnan(value))


def test_a_job_that_raises_leaves_only_its_own_row_unscored() -> None:
    """Issue 52: one job's exception used to be raised for the whole batch (every row None)."""
    jobs = {0: lambda: 1.0, 3: lambda: int("x"), 5: lambda: 0.5}
    assert run_batch(jobs, workers=2, deadline_s=30.0) == {0: 1.0, 3: None, 5: 0.5}
