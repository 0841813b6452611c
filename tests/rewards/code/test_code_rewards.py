"""The four code rewards: shipped references pass, wrong and hostile code scores 0 (never None),
only a harness fault gives None; style and similarity figures worked out by hand."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from grpo_cli.config.schema import RewardFunctionConfig, SandboxConfig
from grpo_cli.rewards import RewardBatch, RewardExecutor, RewardFusion, resolve_reward_sources, score_and_fuse
from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.code import HarnessFault
from grpo_cli.rewards.code.batch import sandbox_backend
from grpo_cli.rewards.code.sandboxed_rewards import TASK_COLUMNS, code_tests
from grpo_cli.rewards.code.static_rewards import code_compiles, code_similarity, code_style
from tests.rewards.code.conftest import MODES, REQUIRED_BACKENDS, isolation_missing, mode_id

TASKS = [json.loads(line) for line in (files("grpo_cli.data") / "code_tasks.jsonl").read_text().splitlines()]
FAST = {"timeout_s": 2.0, "workers": 2}  # sandbox kwargs for these tests: hostile cases cost 2 s each at most


def _columns(tasks: list[dict]) -> dict[str, list]:
    return {k: [t.get(k) for t in tasks] for k in TASK_COLUMNS}


def _run(tasks: list[dict], completions: list[str], **kwargs) -> list[float | None]:
    return code_tests([t["prompt"] for t in tasks], completions, **_columns(tasks), **{**FAST, **kwargs})


def _task(entry_point: str) -> dict:
    return next(t for t in TASKS if t["entry_point"] == entry_point)


PERTURB = """

_reference = {name}


def _perturb(value):
    if type(value) is bool:
        return not value
    if type(value) in (int, float):
        return value + 1
    if type(value) is str:
        return value + "!"
    if type(value) in (list, tuple):
        return type(value)([*value, 0])
    if type(value) is dict:
        return {{**value, "!": 0}}
    return 0


def {name}(*args, **kwargs):
    return _perturb(_reference(*args, **kwargs))
"""


def _wrong(task: dict) -> tuple[str, str]:
    """Two wrong versions of the reference: one returns None (prints nothing), one is off by a
    little on every answer (an extra output line for stdin/stdout tasks)."""
    name = task["entry_point"]
    if name is None:
        return "import sys\n", task["reference"] + "print()\nprint('done')\n"
    return f"def {name}(*args, **kwargs):\n    return None\n", task["reference"] + PERTURB.format(name=name)


def test_the_four_rewards_are_builtins() -> None:
    for name, fn in [
        ("code_compiles", code_compiles),
        ("code_tests", code_tests),
        ("code_style", code_style),
        ("code_similarity", code_similarity),
    ]:
        assert BUILTIN_REWARDS[name] is fn


# ---- code_tests on the shipped tasks ------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_every_shipped_reference_scores_one_under_mode_all_on_every_backend(mode, sandbox_factory) -> None:
    backend, prewarm = mode
    if isinstance(sandbox_factory.build(backend), HarnessFault):  # as the `sandbox` fixture decides
        (isolation_missing if backend in REQUIRED_BACKENDS else pytest.skip)(f"no {backend} sandbox here")
    scores = _run(TASKS, [t["reference"] for t in TASKS], mode="all", backend=backend, prewarm=prewarm)
    assert scores == [1.0] * len(TASKS), [t["entry_point"] for t, s in zip(TASKS, scores) if s != 1.0]


def test_every_shipped_reference_passes_its_tests_and_wrong_versions_do_not() -> None:
    backend = sandbox_backend(**FAST)
    assert backend in ("bwrap", "unshare", "process")
    wrong = [_wrong(t) for t in TASKS]
    completions = [t["reference"] for t in TASKS] + [w[0] for w in wrong] + [w[1] for w in wrong]
    scores = _run(TASKS * 3, completions)
    n = len(TASKS)
    failing = [t["entry_point"] or t["prompt"][:40] for t, s in zip(TASKS, scores[:n]) if s != 1.0]
    assert not failing, f"references below 1.0 on {backend}: {failing}"
    for label, part in (("returns None", scores[n : 2 * n]), ("off by a little", scores[2 * n :])):
        assert all(s is not None and s < 1.0 for s in part), (label, part)
        assert sum(part) / n < 0.25, (label, part)


def test_a_fenced_body_after_the_prompt_is_assembled_and_passes() -> None:
    task = _task("squeeze_spaces")
    completion = 'Sure:\n```python\n    return " ".join(text.split())\n```\nThis splits on whitespace.'
    assert _run([task], [completion]) == [1.0]
    assert code_compiles([task["prompt"]], [completion], entry_point=["squeeze_spaces"]) == [1.0]


def test_check_scores_the_share_of_assert_statements_that_pass() -> None:
    task = _task("digital_root")  # six asserts; one digit sum instead of repeated ones passes three
    one_pass = "def digital_root(n):\n    return n % 10 if n < 10 else sum(map(int, str(n)))\n"
    # 0 -> 0, 9 -> 9, 10 -> 1 pass; 38 -> 11, 99999 -> 45, 123456789 -> 45 fail
    assert _run([task], [one_pass]) == [0.5]


def test_a_check_that_swallows_exceptions_gets_no_units_from_a_dead_session() -> None:
    test = (
        "def check(candidate):\n"
        "    assert candidate(2) == 4\n"
        "    assert candidate(3) == 9\n"
        "    try:\n"  # meant to check that negative input raises
        "        candidate(-1)\n"
        "        assert False\n"
        "    except Exception:\n"
        "        pass\n"
    )
    task = {"prompt": "def sq(x):\n", "entry_point": "sq", "test": test, "test_list": None, "io": None}
    honest = "    if x < 0:\n        raise ValueError(x)\n    return x * x\n"
    hangs_on_3 = "    while x == 3:\n        pass\n    if x < 0:\n        raise ValueError(x)\n    return x * x\n"
    # the second unit times out; the third would "pass" on the dead session's exception
    assert _run([task, task], [honest, hangs_on_3], timeout_s=1.0) == [1.0, 1 / 3]


def test_mbpp_asserts_compare_strictly_in_the_parent() -> None:
    task = _task("same_letters")  # `== True` / `== False`: an int 1 is not True
    as_ints = (
        "def same_letters(a, b):\n"
        "    return int(sorted(a.lower().replace(' ', '')) == sorted(b.lower().replace(' ', '')))\n"
    )
    assert _run([task], [as_ints]) == [0.0]
    task = _task("mean_of_evens")  # one assert is `abs(f(...) - 14 / 3) < 1e-9`: run here through the proxy
    as_float_sum = (
        "def mean_of_evens(nums):\n    e = [x for x in nums if x % 2 == 0]\n    return sum(e) / len(e) if e else 0\n"
    )
    assert _run([task], [as_float_sum]) == [1.0]  # 0 == 0.0 by value: ints and floats compare as numbers


def test_io_compares_every_normalised_line_count_included() -> None:
    task = {
        "prompt": "Print the sum of two integers.",
        "entry_point": None,
        "test": None,
        "test_list": None,
        "io": [{"input": "2 3\n", "output": "5\n"}, {"input": "-1 1\n", "output": "0\n"}],
    }
    solution = "a, b = map(int, input().split())\n"
    completions = [
        solution + "print(a + b)\n",
        solution + "print(a + b, '  ')\nprint()\nprint()\n",  # trailing spaces and blank lines: normalised away
        solution + "print(a + b)\nprint(a + b)\n",  # one line too many
        solution + "print(a + b if a > 0 else 1)\n",  # right on one case of two
        solution + "print(a + b)\nraise SystemExit(3)\n",  # right output, then a failing exit: not accepted
        "import sys\nsys.stdout.write('5\\n')\nsys.exit(0)\n",  # a constant guess: right once
    ]
    assert _run([task] * len(completions), completions) == [1.0, 1.0, 0.0, 0.5, 0.0, 0.5]


HOSTILE = [
    "    while True:\n        pass\n",  # infinite loop: killed at the session's deadline
    "    import time\n    time.sleep(60)\n",
    "    import sys\n    sys.exit(0)\n",  # exit before the tests: no verdict is read from it
    "    import os\n    os._exit(0)\n",
    "    class Yes:\n        def __eq__(self, other):\n            return True\n    return Yes()\n",  # AlwaysEqual
    "    print('x' * 10_000_000)\n",  # output flood
    "    blob = bytearray(4 * 1024 ** 3)\n",  # memory bomb past the address-space limit
    '    print(\'{"id": 1, "ok": 1}\', flush=True)\n    return -1\n',  # a forged record on stdout
    "    raise RuntimeError('no')\n",
    "    return count_set_bits(n)\n",  # unbounded recursion
]


def test_an_empty_body_scores_zero_on_every_shipped_task() -> None:
    """Issue 21 item 7: units an empty body passes (`candidate([]) is None`) do not count on their
    own. `pass` scored 0.5 on second_largest (3 of its 6 units expect None); a completion that
    only gets those right earns nothing, one that also gets a real unit right earns them all."""
    empty = ["pass\n" if t["io"] else f"def {t['entry_point']}(*args, **kwargs):\n    return None\n" for t in TASKS]
    assert _run(TASKS, empty) == [0.0] * len(TASKS)
    task = _task("second_largest")
    completions = [
        "    pass\n",
        "    return None if len(set(nums)) < 2 else max(nums)\n",  # right only where None is expected
        "    return sorted(set(nums))[-2]\n",  # right on the 3 others, raises on the None cases
        task["reference"],
    ]
    assert _run([task] * 4, completions) == [0.0, 0.0, 0.5, 1.0]
    assert _run([task] * 4, completions, mode="all") == [0.0, 0.0, 0.0, 1.0]


def test_hostile_completions_score_zero_never_none() -> None:
    task = _task("count_set_bits")
    assert _run([task] * len(HOSTILE), HOSTILE) == [0.0] * len(HOSTILE)


def test_hostile_completions_score_zero_under_check_and_io_too() -> None:
    check_task = _task("digital_root")  # check(candidate) runs here: an AlwaysEqual never reaches its ==
    io_task = next(t for t in TASKS if t["io"] is not None)
    programs = ["while True:\n    pass\n", "import sys\nsys.exit(0)\n", "while True:\n    print('5' * 4096)\n"]
    tasks = [check_task] * 3 + [io_task] * 3
    assert _run(tasks, [HOSTILE[4], HOSTILE[2], HOSTILE[0], *programs]) == [0.0] * 6


def test_what_does_not_compile_scores_zero_without_a_sandbox_and_a_harness_fault_gives_none() -> None:
    task = _task("triangle")
    prompts, columns = [task["prompt"]] * 4, _columns([task] * 4)
    columns["test_list"][3] = None  # a row with no tests at all: nothing to judge
    completions = ["    return n * (n + 1) // 2\n", "    return n *\n", "", "    return 0\n"]
    # process backend + require_isolation: the real sandbox refuses to start (HarnessFault)
    refused = code_tests(prompts, completions, **columns, backend="process", require_isolation=True)
    assert refused == [None, 0.0, 0.0, None]
    assert code_tests(prompts, completions, **columns, **FAST) == [1.0, 0.0, 0.0, None]


def test_a_batch_past_its_deadline_scores_started_and_unstarted_runs_zero() -> None:
    task = _task("triangle")
    loops = ["    while True:\n        pass\n"] * 2
    scores = code_tests(
        [task["prompt"]] * 2, loops, **_columns([task] * 2), timeout_s=3.0, workers=1, batch_timeout_s=0.5
    )
    assert scores == [0.0, 0.0]


def test_a_wrong_answer_queued_behind_hangs_does_not_win_its_group() -> None:
    """Issue 21 item 1: with one worker, a 1 s run timeout and 1.5 s for the batch, the last two
    of [hang, hang, hang, wrong] never start. Scored None, code_tests left their fused mean, and
    the wrong answer (it compiles) fused to 1.0 against the hangs' 0.5."""
    task = _task("triangle")
    hang, wrong = "    while True:\n        pass\n", "    return 0\n"
    specs = [
        RewardFunctionConfig(
            name="code_tests", target="code_tests", kwargs={"workers": 1, "timeout_s": 1.0, "batch_timeout_s": 1.5}
        ),
        RewardFunctionConfig(name="code_compiles", target="code_compiles"),
    ]
    sources = resolve_reward_sources(specs, sandbox=SandboxConfig())
    batch = RewardBatch.from_groups([task], [hang, hang, hang, wrong], [5] * 4, 4)
    with RewardExecutor(num_workers=0, default_timeout_s=60.0) as executor:
        result = score_and_fuse(executor, RewardFusion(sources), batch)
    assert result.per_function["code_tests"] == [0.0] * 4
    assert result.fused == [0.5] * 4


# ---- static checks -----------------------------------------------------------------------------------
def test_code_compiles_needs_code_and_compiles_the_assembled_program() -> None:
    prompt = "def f(x):\n"
    completions = ["    return x\n", "```python\ndef f(x):\n    return x\n```", "    return x +\n", "", "```\n```"]
    assert code_compiles([prompt] * 5, completions, entry_point=["f"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert code_compiles(["q"], ["print(1)\n"]) == [1.0]  # no entry point: the completion alone


def test_code_style_counts_errors_per_completion_line() -> None:
    prompt = "def f(x) :\n"  # E203 in the prompt: not the completion's
    body = "    y=x*2\n    if y > 3 :\n        return y\n\n    return 0\n"
    # E225 on `y=x*2` (x*2 is E226, ignored by default), E203 on `3 :`; 4 non-blank lines
    assert code_style([prompt], [body], entry_point=["f"]) == [1 - 2 / 4]
    clean = "    y = x * 2\n    return y\n"
    long_line = "    return x + " + "1 + " * 20 + "1\n"  # 99 characters: E501 at the default 79
    assert code_style([prompt] * 3, [clean, long_line, "    return x +\n"], entry_point=["f"] * 3) == [1.0, 0.0, 0.0]
    assert code_style([prompt], [long_line], entry_point=["f"], max_line_length=120) == [1.0]


def test_code_style_scores_zero_where_pycodestyle_cannot_read_the_program() -> None:
    """Issue 21 item 3: a first statement that is a lone string-prefix letter compiles, and
    pycodestyle raises IndexError on it; that cost the whole batch its code_style scores."""
    completions = ["B #x\n", "b\n", "u #\n", "x = 1\n"]
    assert code_style(["q"] * 4, completions) == [0.0, 0.0, 0.0, 1.0]


def test_code_similarity_penalises_overlap_with_the_reference_above_the_threshold() -> None:
    prompt = "def f(x):\n"
    reference = "def f(x):\n    y = x * 2\n    return y\n"
    # prompt lines are dropped from both sides: the reference's tokens are `y = x * 2 return y`,
    # 4 token 4-grams; `return 0` keeps 3 of them (overlap 0.75)
    copies = ["    y = x * 2\n    return y\n", "    y = x * 2\n    return 0\n", "    return x + x\n", ""]
    n = len(copies)
    assert code_similarity([prompt] * n, copies, reference=[reference] * n) == [-1.0, 0.0, 0.0, 0.0]
    assert code_similarity([prompt] * n, copies, reference=[reference] * n, threshold=0.5) == [-1.0, -0.5, 0.0, 0.0]
    padded = "    z = 0\n    y = x * 2\n    return y\n"  # padding a copy does not hide it (containment)
    assert code_similarity([prompt], [padded], reference=[reference]) == [-1.0]
    with pytest.raises(ValueError):
        code_similarity([prompt], ["x"], reference=[reference], threshold=1.0)


# ---- the sandbox section (the smoke run with reward=code: tests/e2e/test_code_runs.py) ----------------------
def test_the_sandbox_section_fills_code_tests_kwargs_and_the_reward_kwargs_win() -> None:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from grpo_cli.commands.entry import register_schemas
    from grpo_cli.rewards import resolve_reward_sources

    register_schemas()
    # reward.functions.0 is code_tests
    overrides = ["reward=code", "sandbox.timeout_s=3", "sandbox.prewarm=false", "+reward.functions.0.kwargs.workers=1"]
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=overrides))  # as the CLI does
    sources = {s.name: s for s in resolve_reward_sources(cfg.reward.functions, sandbox=cfg.sandbox)}
    tests_kwargs = sources["code_tests"].kwargs
    assert tests_kwargs["timeout_s"] == 3 and tests_kwargs["prewarm"] is False and tests_kwargs["backend"] == "auto"
    assert tests_kwargs["workers"] == 1  # the reward's own kwargs beat sandbox.workers (2)
    assert "timeout_s" not in sources["code_style"].kwargs  # only functions that run code get the section
