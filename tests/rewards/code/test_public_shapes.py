"""code_tests on tasks in the public shapes as users bring them: HumanEval checks that use the
prompt's helpers or call the function by name, MBPP rows with set-up code, imports and challenge
asserts, one rule for `==`, units that must exercise the candidate, mode fraction|all, and the
code_efficiency term."""

from __future__ import annotations

import random

import pytest

from grpo_cli.config.schema import RewardFunctionConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards.code.sandboxed_rewards import TASK_COLUMNS, code_efficiency, code_tests
from grpo_cli.rewards.sources import resolve_reward_sources, reward_diagnostics

FAST = {"timeout_s": 5.0, "workers": 2}


def _score(task: dict, completions: list[str], fn=code_tests, **kwargs) -> list[float | None]:
    n = len(completions)
    columns = {name: [task.get(name)] * n for name in TASK_COLUMNS}
    if fn is code_efficiency:
        columns["reference"] = [task["reference"]] * n
    return fn([task["prompt"]] * n, completions, **columns, **{**FAST, **kwargs})


# ---- HumanEval: the prompt's helpers and the function's own name ------------------------------------
SHIFT = {
    "prompt": (
        "def encode_shift(text):\n"
        "    return ''.join(chr((ord(c) - 97 + 3) % 26 + 97) for c in text)\n\n\n"
        "def decode_shift(text):\n"
        '    """Undo encode_shift on a lowercase string.\n\n'
        "    >>> decode_shift(encode_shift('abc'))\n    'abc'\n"
        '    """\n'
    ),
    "entry_point": "decode_shift",
    "reference": "def decode_shift(text):\n    return ''.join(chr((ord(c) - 97 - 3) % 26 + 97) for c in text)\n",
    "test": (
        "import random\n\n\n"
        "def check(candidate):\n"
        "    assert True, 'simple cases first'\n"
        "    assert candidate(encode_shift('xyz')) == 'xyz'\n"
        "    for _ in range(20):\n"
        "        word = ''.join(random.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(8))\n"
        "        assert candidate(encode_shift(word)) == word\n"
        "    assert True, 'edge cases next'\n"
        "    assert decode_shift('') == ''\n"
    ),
}
BODY = "    return ''.join(chr((ord(c) - 97 - 3) % 26 + 97) for c in text)\n"


def test_a_check_that_calls_a_prompt_helper_scores_the_canonical_solution_one() -> None:
    # before: encode_shift was not defined where check() ran, so every unit that uses it failed
    assert _score(SHIFT, [SHIFT["reference"], BODY], mode="all") == [1.0, 1.0]


def test_a_whole_function_completion_gets_the_prompts_imports_and_helpers() -> None:
    task = {
        "prompt": "import math\n\n\ndef poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n\n"
        'def root(xs):\n    """A root of the linear polynomial xs = [b, a].\n\n'
        '    >>> root([-2, 1])\n    2.0\n    """\n',
        "entry_point": "root",
        "test": "def check(candidate):\n    for xs in ([-2, 1], [3, 4], [1, -7]):\n"
        "        assert math.fabs(poly(xs, candidate(xs))) < 1e-9\n",
    }
    whole = "def root(xs):\n    return math.copysign(math.fabs(xs[0] / xs[1]), -xs[0] / xs[1])\n"
    wrong = "def root(xs):\n    return poly(xs, 1.0)\n"  # uses the helper in the sandbox, answers wrong
    assert _score(task, [whole, wrong], mode="all") == [1.0, 0.0]


def test_a_check_that_calls_the_entry_point_by_name_scores_the_canonical_solution_one() -> None:
    task = {
        "prompt": 'def running_total(xs):\n    """Prefix sums.\n\n    >>> running_total([1, 2])\n    [1, 3]\n    """\n',
        "entry_point": "running_total",
        "test": "def check(candidate):\n    assert running_total([]) == []\n"
        "    assert running_total([1, 2, 3]) == [1, 3, 6]\n    assert candidate([5]) == [5]\n"
        "\n\ncheck(running_total)\n",
    }
    body = "    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out\n"
    # before: the name was the prompt's stub (or undefined), two of three units failed
    assert _score(task, [body], mode="fraction") == [1.0]


# ---- units must exercise the candidate -----------------------------------------------------------
FORGED = (
    "    class Yes:\n        def __eq__(self, other):\n            return True\n"
    "        def __ne__(self, other):\n            return False\n    return Yes()\n"
)


def test_assert_true_lines_are_not_units_so_forged_and_empty_answers_score_exactly_zero() -> None:
    # SHIFT's check holds two `assert True` lines among four units: they scored 2/4 = 0.5 before
    completions = [FORGED, "    return None\n", "    pass\n"]
    assert _score(SHIFT, completions) == [0.0, 0.0, 0.0]
    mbpp = {
        "prompt": 'def twice(x):\n    """Double x.\n\n    >>> twice(2)\n    4\n    """\n',
        "entry_point": "twice",
        "test_list": ["assert twice(2) == 4", "assert True", "assert twice(0) == 0", "assert len('ab') == 2"],
    }
    assert _score(mbpp, ["    return x * 2\n", FORGED, "    return None\n"]) == [1.0, 0.0, 0.0]


def test_a_top_level_check_call_in_the_test_source_does_not_run_the_units_twice() -> None:
    task = {
        "prompt": "def inc(x):\n",
        "entry_point": "inc",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 4\n\ncheck(inc)\n",
    }
    assert _score(task, ["    return x + 1\n"]) == [0.5]


# ---- mode fraction | all --------------------------------------------------------------------------
def test_mode_all_gives_one_only_when_every_unit_passes() -> None:
    task = {
        "prompt": "def sign(x):\n",
        "entry_point": "sign",
        "test_list": ["assert sign(5) == 1", "assert sign(-3) == -1", "assert sign(0) == 0"],
    }
    answers = ["    return (x > 0) - (x < 0)\n", "    return 1 if x > 0 else -1\n", "    return 7\n"]
    assert _score(task, answers, mode="fraction") == [1.0, pytest.approx(2 / 3), 0.0]
    assert _score(task, answers, mode="all") == [1.0, 0.0, 0.0]


def test_an_unknown_mode_stops_at_start_up_naming_the_key() -> None:
    spec = RewardFunctionConfig(name="code_tests", target="code_tests", kwargs={"mode": "most"})
    with pytest.raises(GrpoError, match=r"code_tests.*mode='most'.*fraction, all"):
        reward_diagnostics(resolve_reward_sources([spec]))


# ---- MBPP fields ------------------------------------------------------------------------------------
INTERVALS = {
    "prompt": 'def covered(spans):\n    """Total length covered by Span(start, end) objects.\n\n'
    '    >>> covered([Span(0, 2)])\n    2\n    """\n',
    "entry_point": "covered",
    "test_setup_code": "class Span:\n    def __init__(self, start, end):\n        self.start, self.end = start, end\n",
    "test_imports": ["import math"],
    "test_list": [
        "assert covered([Span(1, 3), Span(2, 5)]) == 4",
        "assert covered([]) == 0",
        "assert math.isclose(covered([Span(0, 1), Span(5, 6)]), 2)",
    ],
    "challenge_test_list": ["assert covered([Span(0, 10), Span(2, 3), Span(9, 12)]) == 12"],
}
MERGING = (
    "    total, end = 0, -math.inf\n"
    "    for span in sorted(spans, key=lambda s: s.start):\n"
    "        if span.end > end:\n"
    "            total += span.end - max(span.start, end)\n"
    "            end = span.end\n"
    "    return total\n"
)
NAIVE = "    return sum(s.end - s.start for s in spans)\n"  # passes all but the overlapping cases


def test_mbpp_set_up_code_and_imports_reach_the_candidate_and_the_asserts() -> None:
    # before: Span was undefined in the sandbox and the parent, and math unimported in the sandbox
    assert _score(INTERVALS, [MERGING], mode="all") == [1.0]


def test_challenge_asserts_count_as_units() -> None:
    # NAIVE passes 2 of the 3 plain asserts and fails the challenge one: 2 of 4
    assert _score(INTERVALS, [NAIVE]) == [0.5]
    assert _score({**INTERVALS, "challenge_test_list": None}, [NAIVE]) == [pytest.approx(2 / 3)]


# ---- one notion of equal ----------------------------------------------------------------------------
def test_one_rule_for_equal_in_check_and_in_asserts_bool_is_not_int() -> None:
    check = {
        "prompt": "def is_even(n):\n",
        "entry_point": "is_even",
        "test": "def check(candidate):\n    assert candidate(2) == True\n    assert candidate(3) == False\n",
    }
    asserts = {**check, "test": None, "test_list": ["assert is_even(2) == True", "assert is_even(3) == False"]}
    answers = ["    return n % 2 == 0\n", "    return 1 - n % 2\n", "    return float(1 - n % 2)\n"]
    # bool answers pass; 1/0 and 1.0/0.0 are not True/False, in both shapes (check() used Python's == before)
    assert _score(check, answers) == _score(asserts, answers) == [1.0, 0.0, 0.0]
    numbers = {
        "prompt": "def half(n):\n",
        "entry_point": "half",
        "test": "def check(candidate):\n    assert candidate(4) == 2\n    assert candidate(3) == 1.5\n",
    }
    # an int and a float of the same value are equal; a float within 1e-9 relative is too
    assert _score(numbers, ["    return n / 2\n", "    return n / 2 * (1 + 1e-12)\n", "    return n // 2\n"]) == [
        1.0,
        1.0,
        0.5,
    ]


def test_random_inputs_repeat_and_leave_the_callers_generator_alone() -> None:
    random.seed(123)
    before = random.random()
    random.seed(123)
    first = _score(SHIFT, [BODY, "    return text[::-1] if len(text) % 2 else text\n"])
    second = _score(SHIFT, [BODY, "    return text[::-1] if len(text) % 2 else text\n"])
    assert first == second
    assert random.random() == before  # the check's `import random` is a private, seeded one


# ---- code_efficiency --------------------------------------------------------------------------------
DUPLICATES = {
    "prompt": 'def has_duplicate(nums):\n    """True when some value occurs twice.\n\n'
    '    >>> has_duplicate([1, 2, 1])\n    True\n    """\n',
    "entry_point": "has_duplicate",
    "reference": "def has_duplicate(nums):\n    seen = set()\n    for x in nums:\n        if x in seen:\n"
    "            return True\n        seen.add(x)\n    return False\n",
    "test": "def check(candidate):\n    assert candidate(list(range(200))) == False\n"
    "    assert candidate(list(range(150)) + [7]) == True\n    assert candidate([]) == False\n",
}
QUADRATIC = (
    "def has_duplicate(nums):\n    for i in range(len(nums)):\n        for j in range(i + 1, len(nums)):\n"
    "            if nums[i] == nums[j]:\n                return True\n    return False\n"
)
LINEAR = (
    "def has_duplicate(nums):\n    return len(set(nums)) < len(nums)\n"  # all in C: no more work than the reference
)


def test_efficiency_rewards_the_linear_solution_over_the_quadratic_one_and_repeats() -> None:
    completions = [DUPLICATES["reference"], LINEAR, QUADRATIC, "    return False\n"]
    assert _score(DUPLICATES, completions, mode="all") == [1.0, 1.0, 1.0, 0.0]  # all but the last pass
    first = _score(DUPLICATES, completions, fn=code_efficiency)
    second = _score(DUPLICATES, completions, fn=code_efficiency)
    assert first == second  # counted instructions, not time: the same on every run
    reference, linear, quadratic, failing = first
    assert reference == 1.0 and linear == 1.0 and failing == 0.0
    # the reference makes ~350 loop passes over 351 inputs; the nested loops ~30,000 comparisons
    assert 0.005 < quadratic < 0.05, quadratic


def test_efficiency_gives_nothing_to_code_that_touches_the_tracer_and_none_without_a_reference() -> None:
    cheat = "import sys\n\n\ndef has_duplicate(nums):\n    sys.settrace(None)\n" + QUADRATIC.split(":\n", 1)[1]
    assert _score(DUPLICATES, [cheat], mode="all") == [1.0]  # it passes the tests ...
    assert _score(DUPLICATES, [cheat], fn=code_efficiency) == [0.0]  # ... but earns no efficiency
    assert _score({**DUPLICATES, "reference": None}, [LINEAR], fn=code_efficiency) == [None]


def test_efficiency_scores_a_function_body_after_the_prompt_like_the_whole_function() -> None:
    body = "    return len(set(nums)) < len(nums)\n"
    assert _score(DUPLICATES, [body], fn=code_efficiency) == _score(DUPLICATES, [LINEAR], fn=code_efficiency) == [1.0]


def test_efficiency_counts_whole_programs_on_stdin_stdout_tasks_too() -> None:
    task = {
        "prompt": "Print 0 + 1 + ... + n for the n on stdin.",
        "entry_point": None,
        "io": [{"input": "5\n", "output": "15\n"}, {"input": "300\n", "output": "45150\n"}],
        "reference": "n = int(input())\nprint(n * (n + 1) // 2)\n",
    }
    loop = "n = int(input())\nt = 0\nfor i in range(n + 1):\n    t += i\nprint(t)\n"
    scores = _score(task, [task["reference"], loop, "print(15)\n"], fn=code_efficiency)
    assert scores[0] == 1.0 and scores[2] == 0.0  # the constant answer fails the second case
    assert 0.01 < scores[1] < 0.1, scores  # the loop runs ~300 iterations where the formula runs none
