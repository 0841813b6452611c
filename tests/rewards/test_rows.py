"""Every builtin that loops over completions isolates each one (issue 21 item 3): one row that
breaks its scorer scores NaN, with its error, and the rest of the batch keeps its scores."""

from __future__ import annotations

import math

import pytest

from grpo_cli.config.schema import RewardFunctionConfig, SandboxConfig
from grpo_cli.rewards import RewardExecutor, resolve_reward_sources
from grpo_cli.rewards.builtin import BUILTIN_REWARDS


class Unprintable:
    """A data value whose text cannot be taken: `str()` raises."""

    def __str__(self) -> str:
        raise ValueError("no text")


# builtin -> (completions, columns, kwargs): row 0 scores, row 1 breaks the scorer (a value that
# is not the text or the number the scorer reads).
BROKEN_ROW = {
    "exact_match": (["2", "2"], {"answer": ["2", Unprintable()]}, {}),
    "answer_partial_credit": (["2", "2"], {"answer": ["2", Unprintable()]}, {}),
    "last_number": (["2", "2"], {"answer": ["2", Unprintable()]}, {}),
    "format": (["<think>a</think><answer>b</answer>", Unprintable()], {}, {}),
    "overlong": (["", ""], {"completion_lengths": [3, "many"]}, {"max_length": 10, "buffer": 4}),
    "repetition": (["go go go go", Unprintable()], {}, {}),
    "code_compiles": (["x = 1\n", Unprintable()], {}, {}),
    "code_style": (["x = 1\n", Unprintable()], {}, {}),
    "code_similarity": (["x = 1\n", "x = 1\n"], {"reference": ["y = 2\n", Unprintable()]}, {}),
    "env_reward": (["a", "b"], {"env_reward": [1.0, "many"]}, {}),
    "code_feedback_final": (["a", "b"], {"env_turn_scores": [[0.0, 0.5], [0.0, "all"]]}, {}),
    "code_feedback_improvement": (["a", "b"], {"env_turn_scores": [[0.0, 0.5], ["none", 1.0]]}, {}),
    "tool_call": (["a", "b"], {"env_tool_calls": [1, "many"], "env_tool_errors": [0, 0]}, {}),
}
# These isolate each completion their own way: math-verify's errors score 0 (or None for a gold
# answer it cannot parse); the sandbox turns anything a candidate does into a score of 0.
OWN_ISOLATION = {"math", "code_tests", "code_efficiency"}


def test_every_builtin_is_covered() -> None:
    assert set(BUILTIN_REWARDS) == set(BROKEN_ROW) | OWN_ISOLATION


@pytest.mark.parametrize("target", sorted(BROKEN_ROW))
def test_a_row_that_breaks_a_builtin_costs_that_row_only(target: str) -> None:
    completions, columns, kwargs = BROKEN_ROW[target]
    (source,) = resolve_reward_sources(
        [RewardFunctionConfig(name=target, target=target, kwargs=kwargs)], sandbox=SandboxConfig()
    )
    with RewardExecutor(num_workers=0, default_timeout_s=None) as executor:
        scores = executor.run([source], ["q", "q"], completions, columns)[target]
    assert scores.error is None and math.isfinite(scores.values[0]) and math.isnan(scores.values[1])
    assert list(scores.row_errors) == [1]
