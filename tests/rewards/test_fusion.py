"""Reward resolution and the minimal fusion: failures become NaN, never a crash."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import RewardFunction, check_columns, fuse_rewards, resolve_reward_functions
from grpo_cli.rewards.builtin import exact_match


def spec(name, target, weight=1.0, kwargs=None):
    return SimpleNamespace(name=name, target=target, weight=weight, kwargs=kwargs or {})


def test_weighted_mean_skips_nan_and_all_nan_stays_nan():
    """R = sum_valid w r / sum_valid w; a sample nobody scored stays NaN (unscorable)."""

    def half(prompts, completions, **_):
        return [1.0, None, None]

    def const(prompts, completions, **_):
        return [0.0, 0.5, None]

    fns = [RewardFunction("half", half, 3.0), RewardFunction("const", const, 1.0)]
    fused, per_fn = fuse_rewards(fns, {"half": 3.0, "const": 1.0}, ["p"] * 3, ["a", "b", "c"], {})
    assert fused[0] == pytest.approx((3 * 1.0 + 1 * 0.0) / 4)
    assert fused[1] == pytest.approx(0.5)  # only `const` scored it
    assert math.isnan(fused[2])
    assert math.isnan(per_fn["half"][1])


def test_raising_function_scores_nan_for_its_batch_only():
    def boom(prompts, completions, **_):
        raise RuntimeError("reward server down")

    fns = [RewardFunction("boom", boom, 1.0), RewardFunction("exact", exact_match, 1.0)]
    fused, per_fn = fuse_rewards(fns, {}, ["p", "p"], ["1", "2"], {"answer": ["1", "1"]})
    assert all(math.isnan(v) for v in per_fn["boom"])
    assert fused == [1.0, 0.0]


def test_wrong_length_or_non_numeric_values_are_nan():
    def short(prompts, completions, **_):
        return [1.0]

    def text(prompts, completions, **_):
        return ["x", 2]

    fns = [RewardFunction("short", short, 1.0), RewardFunction("text", text, 1.0)]
    _, per_fn = fuse_rewards(fns, {}, ["p", "p"], ["a", "b"], {})
    assert all(math.isnan(v) for v in per_fn["short"])
    assert math.isnan(per_fn["text"][0]) and per_fn["text"][1] == 2.0


def test_import_path_resolves_and_bad_targets_fail_at_startup():
    resolved = resolve_reward_functions([spec("em", "grpo_cli.rewards.builtin:exact_match", 0.5)])
    assert resolved[0].fn is exact_match and resolved[0].weight == 0.5
    with pytest.raises(GrpoError, match="cannot import"):
        resolve_reward_functions([spec("x", "no_such_pkg.mod:fn")])
    with pytest.raises(GrpoError, match="has no function"):
        resolve_reward_functions([spec("x", "grpo_cli.rewards.builtin:nope")])
    with pytest.raises(GrpoError, match="neither a builtin"):
        resolve_reward_functions([spec("x", "exact_mtch")])
    with pytest.raises(GrpoError, match="must accept"):
        resolve_reward_functions([spec("x", "math:sqrt")])
    with pytest.raises(GrpoError, match="duplicate"):
        resolve_reward_functions([spec("a", "exact_match"), spec("a", "last_number")])


def test_missing_data_column_fails_before_training():
    fns = resolve_reward_functions([spec("em", "exact_match")])
    check_columns(fns, ["answer"])
    with pytest.raises(GrpoError, match=r"needs data column\(s\) \['answer'\]"):
        check_columns(fns, ["solution"])
