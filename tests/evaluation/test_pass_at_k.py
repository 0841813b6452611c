"""pass@k against its closed form 1 − C(n−c, k)/C(n, k) (Chen et al. 2021), and the success rule
that decides c."""

from __future__ import annotations

import math

import pytest

from grpo_cli.config.schema import EvalMetricsConfig
from grpo_cli.errors import GrpoError
from grpo_cli.evaluation import ScoredSamples, SuccessRule, mean_pass_at_k, pass_at_k, sample_metrics


def closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_k_equal_to_n_is_whether_any_completion_succeeded() -> None:
    for n in (1, 2, 5, 8):
        assert pass_at_k(n, 0, n) == 0.0
        for c in range(1, n + 1):
            assert pass_at_k(n, c, n) == 1.0


def test_all_wrong_is_zero_and_all_right_is_one() -> None:
    for n in (1, 4, 16):
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0


def test_worked_case() -> None:
    # n=5, c=2, k=2: 1 − C(3,2)/C(5,2) = 1 − 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)


def test_matches_the_closed_form_everywhere_and_pass_at_1_is_the_success_rate() -> None:
    for n in range(1, 21):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)


def test_large_n_is_stable() -> None:
    """C(1000, 100) has 140 digits; the product form never builds it. One correct in n: k/n."""
    assert pass_at_k(1000, 1, 100) == pytest.approx(0.1, abs=1e-12)
    assert 0.0 < pass_at_k(100_000, 3, 7) < 1.0


def test_k_above_n_and_impossible_counts_are_errors() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_averaged_over_prompts() -> None:
    groups = [[True, True, False, False], [False] * 4, [True] * 4]
    assert mean_pass_at_k(groups, 1) == pytest.approx(0.5)
    assert mean_pass_at_k(groups, 2) == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert mean_pass_at_k(groups, 4) == pytest.approx(2 / 3)


def test_success_is_the_named_function_at_its_threshold_and_nan_fails() -> None:
    samples = ScoredSamples(2)
    nan = math.nan
    samples.add([0.9, 0.2, nan, 0.5], {"a": [1.0, 0.4, nan, 0.5], "b": [0.8, 0.0, nan, 0.5]}, [1] * 4, [False] * 4)
    assert sample_metrics(samples, SuccessRule.resolve(["a", "b"], EvalMetricsConfig()))["accuracy"] == 0.25  # first: a
    b_at_half = SuccessRule.resolve(["a", "b"], EvalMetricsConfig(success="b", success_threshold=0.5))
    assert sample_metrics(samples, b_at_half)["accuracy"] == 0.5
    metrics = sample_metrics(samples, SuccessRule("a", 0.45), ks=[1, 2])  # groups: [yes, no], [NaN, yes]
    assert (metrics["accuracy"], metrics["pass@1"], metrics["pass@2"]) == (0.5, 0.5, 1.0)
    assert metrics["reward/mean"] == pytest.approx((0.9 + 0.2 + 0.5) / 3)  # unscorable left out of the mean
    with pytest.raises(GrpoError, match=r"eval.success=exact: not a reward function .*did you mean exact_match\?"):
        SuccessRule.resolve(["exact_match"], EvalMetricsConfig(success="exact"))
    with pytest.raises(GrpoError, match=r"eval.k has 3, more than the 2 completions per prompt"):
        sample_metrics(samples, SuccessRule("a", 1.0), ks=[1, 3])
