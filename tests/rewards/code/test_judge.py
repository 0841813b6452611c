"""The judge's verdicts as code_tests scores them: a program whose tests never ran to their end has
not passed them, whatever share of the counted units it passed."""

from __future__ import annotations

from grpo_cli.rewards.code.sandboxed_rewards import code_tests

# The last statement of check() holds no assert: not a unit, but the tests end there only if the
# candidate returns from it (HumanEval checks that call the candidate for its side effects do this).
TEST = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n    candidate(-1)\n"
PROMPT = "def sq(x):\n"
HONEST = "    return x * x\n"
RAISES = "    if x < 0:\n        raise ValueError(x)\n    return x * x\n"
HANGS = "    while x < 0:\n        pass\n    return x * x\n"


def test_a_program_whose_tests_never_finished_has_not_passed_them_all() -> None:
    completions = [HONEST, RAISES, HANGS]
    n = len(completions)
    scores = code_tests(
        [PROMPT] * n, completions, entry_point=["sq"] * n, test=[TEST] * n, mode="all", timeout_s=1.0, workers=3
    )
    # both units passed by all three; the check ended only for the honest one
    assert scores == [1.0, 0.0, 0.0]
    fraction = code_tests([PROMPT] * n, completions, entry_point=["sq"] * n, test=[TEST] * n, timeout_s=1.0, workers=3)
    assert fraction == [1.0, 1.0, 1.0]  # the share of counted units: no unit was left unreached
