"""Reward resolution and fusion: NaN-safe weighted mean, masking with fallback, weight effect."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_cli.config.schema import RewardConfig, RewardFunctionConfig, SandboxConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.core.advantages import group_advantages
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import (
    BatchScores,
    RewardBatch,
    RewardExecutor,
    RewardFusion,
    RewardSource,
    check_columns,
    resolve_reward_sources,
    score_and_fuse,
    score_each,
)
from grpo_cli.rewards.builtin import exact_match
from grpo_cli.training.metrics import nan_rate_alerts

NAN = math.nan


def spec(name, target, weight=1.0, kwargs=None, **extra):
    """The real config dataclass, as the CLI composes it: a stand-in once hid a wrong default."""
    return RewardFunctionConfig(name=name, target=target, weight=weight, kwargs=kwargs or {}, **extra)


def source(name, weight=1.0, **extra):
    return RewardSource(name, lambda p, c, **_: [0.0] * len(c), weight, **extra)


def batch(*values, error=None):
    return BatchScores([NAN if v is None else float(v) for v in values], error)


# ---- resolution ------------------------------------------------------------------------------
def test_import_path_resolves_and_bad_targets_fail_at_startup():
    resolved = resolve_reward_sources([spec("em", "grpo_cli.rewards.builtin:exact_match", 0.5)])
    assert resolved[0].fn is exact_match and resolved[0].weight == 0.5
    assert resolved[0].normalize == "none" and resolved[0].fallback is None and not resolved[0].parallel
    with pytest.raises(GrpoError, match="cannot import"):
        resolve_reward_sources([spec("x", "no_such_pkg.mod:fn")])
    with pytest.raises(GrpoError, match="has no function"):
        resolve_reward_sources([spec("x", "grpo_cli.rewards.builtin:nope")])
    with pytest.raises(GrpoError, match="neither a builtin"):
        resolve_reward_sources([spec("x", "exact_mtch")])
    with pytest.raises(GrpoError, match="the signatures that work"):
        resolve_reward_sources([spec("x", "math:sqrt")])
    with pytest.raises(GrpoError, match="duplicate"):
        resolve_reward_sources([spec("a", "exact_match"), spec("a", "last_number")])


def test_new_spec_fields_are_read_and_validated_naming_the_function():
    specs = [
        spec("em", "exact_match", 2.0, normalize="sigmoid", fallback="ln", timeout_s=5, parallel=True),
        spec("ln", "last_number"),
    ]
    em, ln = resolve_reward_sources(specs)
    assert (em.normalize, em.fallback, em.timeout_s, em.parallel) == ("sigmoid", "ln", 5.0, True)
    assert ln.timeout_s is None
    with pytest.raises(GrpoError, match=r"reward 'em': normalize 'zcore' is not one of"):
        resolve_reward_sources([spec("em", "exact_match", normalize="zcore")])
    with pytest.raises(GrpoError, match=r"reward 'em': fallback 'nope' is not a configured"):
        resolve_reward_sources([spec("em", "exact_match", fallback="nope")])
    with pytest.raises(GrpoError, match=r"reward 'em': fallback cannot be the function itself"):
        resolve_reward_sources([spec("em", "exact_match", fallback="em")])
    with pytest.raises(GrpoError, match=r"reward 'em': set target"):
        resolve_reward_sources([spec("em", None)])


def test_parallel_needs_a_picklable_function(monkeypatch):
    """Workers are spawned: a lambda cannot travel to them by reference."""
    import tests.rewards.pool_functions as module

    monkeypatch.setattr(module, "a_lambda", lambda p, c, **_: [1.0] * len(c), raising=False)
    with pytest.raises(GrpoError, match=r"reward 'x': parallel=true needs a module-level function"):
        resolve_reward_sources([spec("x", "tests.rewards.pool_functions:a_lambda", parallel=True)])
    assert resolve_reward_sources([spec("x", "tests.rewards.pool_functions:length", parallel=True)])[0].parallel


def test_missing_data_column_fails_before_training():
    fns = resolve_reward_sources([spec("em", "exact_match")])
    check_columns(fns, ["answer"])
    with pytest.raises(GrpoError, match=r"needs \['answer'\]: give them as data columns"):
        check_columns(fns, ["solution"])
    check_columns(resolve_reward_sources([spec("em", "exact_match", kwargs={"answer": ["1"]})]), [])


# ---- the NaN-safe weighted mean ---------------------------------------------------------------
def test_weighted_mean_skips_nan_and_all_nan_stays_nan():
    """R = sum_valid w r / sum_valid w; a sample nobody scored stays NaN (unscorable)."""
    fusion = RewardFusion([source("half", 3.0), source("const", 1.0)])
    result = fusion.fuse({"half": batch(1.0, None, None), "const": batch(0.0, 0.5, None)}, group_size=1)
    assert result.fused[0] == pytest.approx((3 * 1.0 + 1 * 0.0) / 4)
    assert result.fused[1] == pytest.approx(0.5)  # only `const` scored it
    assert math.isnan(result.fused[2])
    assert result.unscorable_indices == [2]
    assert result.nan_indices == {"half": [1, 2], "const": [2]}
    assert math.isnan(result.per_function["half"][1])


def test_curriculum_weights_override_configured_ones_and_unknown_names_fail():
    fusion = RewardFusion([source("a", 1.0), source("b", 1.0)])
    result = fusion.fuse({"a": batch(1.0), "b": batch(0.0)}, 1, weights={"a": 0.2, "b": 0.8})
    assert result.fused == [pytest.approx(0.2)]
    assert result.effective_weights == {"a": 0.2, "b": 0.8}
    with pytest.raises(GrpoError, match=r"unknown reward function\(s\) \['c'\]"):
        fusion.fuse({"a": batch(1.0), "b": batch(0.0)}, 1, weights={"c": 1.0})


def test_raising_function_scores_nan_for_its_batch_only():
    def boom(prompts, completions, **_):
        raise RuntimeError("reward server down")

    sources = [RewardSource("boom", boom), RewardSource("exact", exact_match)]
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        batch = RewardBatch(["p", "p"], ["1", "2"], {"answer": ["1", "1"]}, group_size=2)
        result = score_and_fuse(executor, RewardFusion(sources), batch)
    assert all(math.isnan(v) for v in result.per_function["boom"])
    assert result.errors == {"boom": "RuntimeError: reward server down", "exact": None}
    assert result.fused == [1.0, 0.0]


@pytest.mark.parametrize(
    "on_row_error, scored, outcome",
    [
        ("zero", 0.0, "scored 0 for them (on_row_error=zero)"),
        ("skip", NAN, "NaN for them, judged by the other functions (on_row_error=skip)"),
    ],
)
def test_a_completion_that_breaks_a_function_costs_that_completion_not_the_batch(on_row_error, scored, outcome):
    """Issue 21 item 3: one completion's exception made the whole batch NaN (128 scores for one
    pycodestyle crash). A function that scores each completion with `score_each` loses that one:
    its floor (0) or NaN there, an alert with the count and the error, and not a failed batch, so
    three such batches do not mask it."""
    picky = spec("picky", "tests.rewards.pool_functions:picky", on_row_error=on_row_error)
    sources = resolve_reward_sources([picky], sandbox=SandboxConfig())
    fusion = RewardFusion(sources, max_consecutive_failures=3)
    completions = ["a", "boom", "ccc", "dd"]
    batch = RewardBatch.from_groups([{"prompt": "p"}], completions, [1] * 4, 4)
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        results = [score_and_fuse(executor, fusion, batch) for _ in range(3)]
    values = results[-1].per_function["picky"]
    assert values[0] == 1.0 and values[2:] == [3.0, 2.0]
    assert values[1] == scored or (math.isnan(scored) and math.isnan(values[1]))
    assert results[-1].alerts == [
        f"reward 'picky' raised on 1 of 4 completions: {outcome}; the rest of its batch stands "
        "(row 1: ValueError: cannot read 'boom')"
    ]
    assert results[-1].errors == {"picky": "ValueError: cannot read 'boom'"}
    assert fusion.masked == []


def test_a_row_missing_a_column_a_function_needs_scores_nan_there_with_a_count_in_the_alert():
    """Issue 21 item 4: rows differ in their columns; the one without `answer` was scored against
    the string "None" (a completion "None" matched it), and the alert said nothing."""
    sources = resolve_reward_sources([spec("em", "exact_match"), spec("len", "tests.rewards.pool_functions:length")])
    fusion = RewardFusion(sources, max_consecutive_failures=1)
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}]
    batch = RewardBatch.from_groups(rows, ["2", "3", "None", "4"], [1] * 4, 2)
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        result = score_and_fuse(executor, fusion, batch)
        em = result.per_function["em"]
        assert em[:2] == [1.0, 0.0] and math.isnan(em[2]) and math.isnan(em[3])
        assert result.per_function["len"] == [1.0, 1.0, 4.0, 1.0]  # a function that needs no answer scores them
        assert result.alerts == [
            "reward 'em': 2 of 4 completions have no 'answer' in their data row (missing or null): NaN for them"
        ]
        # a batch of rows that all lack it is the data's gap, not a failure of the function: never masked
        lacking = RewardBatch.from_groups([{"prompt": "2+2="}], ["4", "None"], [1] * 2, 2)
        assert score_and_fuse(executor, fusion, lacking).masked == []


# ---- failure isolation -------------------------------------------------------------------------
def test_masked_after_exactly_n_consecutive_failures_and_fallback_takes_its_weight():
    sources = [source("flaky", 2.0, fallback="backup"), source("backup", 1.0), source("other", 1.0)]
    fusion = RewardFusion(sources, max_consecutive_failures=3)
    fail = {"flaky": batch(None, None, error="ValueError: flaky"), "backup": batch(1, 1), "other": batch(0, 0)}
    good = {"flaky": batch(1, None), "backup": batch(1, 1), "other": batch(0, 0)}

    # fail, fail, good (resets), fail, fail: never three in a row, so never masked
    for scores in (fail, fail, good, fail, fail):
        result = fusion.fuse(scores, group_size=2)
        assert result.masked == [] and result.alerts == []
    # with flaky NaN, backup and other share equally: (1·1 + 1·0)/2
    assert result.fused == [0.5, 0.5]

    result = fusion.fuse(fail, group_size=2)  # the third failure in a row
    assert result.masked == ["flaky"]
    assert len(result.alerts) == 1
    alert = result.alerts[0]
    assert "'flaky'" in alert and "ValueError: flaky" in alert and "'backup'" in alert
    assert result.effective_weights == {"flaky": 0.0, "backup": 3.0, "other": 1.0}
    assert result.fused == [0.75, 0.75]  # (3·1 + 1·0)/4: backup now carries flaky's weight

    # later batches: still masked, no new alert, flaky's values ignored even if it recovers
    result = fusion.fuse(good, group_size=2)
    assert result.masked == ["flaky"] and result.alerts == []
    assert result.fused == [0.75, 0.75]
    assert result.errors["flaky"] == "ValueError: flaky"


def test_all_nan_batch_counts_as_a_failure_and_without_fallback_weight_is_dropped():
    fusion = RewardFusion([source("none_fn", 5.0), source("ok", 1.0)], max_consecutive_failures=2)
    scores = {"none_fn": batch(None, None), "ok": batch(0.2, 0.4)}
    assert fusion.fuse(scores, 1).masked == []
    result = fusion.fuse(scores, 1)
    assert result.masked == ["none_fn"]
    assert "every value was None" in result.alerts[0] and "no fallback" in result.alerts[0]
    assert result.effective_weights == {"none_fn": 0.0, "ok": 1.0}


def test_fallback_chain_skips_a_masked_fallback():
    sources = [source("a", 1.0, fallback="b"), source("b", 2.0, fallback="c"), source("c", 1.0)]
    fusion = RewardFusion(sources, max_consecutive_failures=1)
    result = fusion.fuse({"a": batch(None), "b": batch(None), "c": batch(1.0)}, 1)
    assert result.masked == ["a", "b"]
    assert result.effective_weights == {"a": 0.0, "b": 0.0, "c": 4.0}


def test_masked_function_is_not_called_again():
    calls = []

    def failing(prompts, completions, **_):
        calls.append(1)
        raise ValueError("down")

    fusion = RewardFusion([RewardSource("f", failing), source("ok")], max_consecutive_failures=1)
    with RewardExecutor(0, 0) as executor:
        for _ in range(3):
            result = score_and_fuse(executor, fusion, RewardBatch(["p"], ["c"], {}, 1))
    assert len(calls) == 1 and result.masked == ["f"] and result.fused == [0.0]


# ---- weight effect -----------------------------------------------------------------------------
def test_weight_effect_matches_hand_computation_and_sums_to_one():
    """a (w=3) = [1, 0, 1, 0]; b (w=1) = [NaN, 0, 1, 1].
    R = [1, 0, (3+1)/4, 1/4] = [1, 0, 1, .25]; x_a = 3a/Σ_valid w = [1, 0, .75, 0]; x_b = [0, 0, .25, .25].
    mean R = .5625; Σ(R−R̄)² = .19140625+.31640625+.19140625+.09765625 = .796875 = 51/64.
    Σ(x_a−.4375)(R−R̄) = .5625·.4375 + (−.4375)(−.5625) + .3125·.4375 + (−.4375)(−.3125) = 49/64.
    So c_a = 49/51 and c_b = 2/51."""
    fusion = RewardFusion([source("a", 3.0), source("b", 1.0)])
    result = fusion.fuse({"a": batch(1, 0, 1, 0), "b": batch(None, 0, 1, 1)}, group_size=4)
    assert result.fused == pytest.approx([1.0, 0.0, 1.0, 0.25])
    assert result.contributions["a"] == pytest.approx([1.0, 0.0, 0.75, 0.0])
    assert result.weight_effect["a"] == pytest.approx(49 / 51)
    assert result.weight_effect["b"] == pytest.approx(2 / 51)
    assert sum(result.weight_effect.values()) == pytest.approx(1.0)


def test_weight_effect_with_constant_reward_falls_back_to_weight_fractions():
    fusion = RewardFusion([source("a", 3.0), source("b", 1.0)])
    result = fusion.fuse({"a": batch(1, 1), "b": batch(1, 1)}, group_size=2)
    assert result.weight_effect == {"a": 0.75, "b": 0.25}


# ---- normalize_then_sum --------------------------------------------------------------------------
def test_normalize_then_sum_group_zscores_then_weighted_sum():
    """Groups of 2. a = [1, 0 | 2, 2], b = [0, 1 | 1, None].
    Group [1, 0]: mean .5, unbiased std √.5, z = ±.5/(√.5 + 1e-4). Group [2, 2]: equal -> 0.
    b: [0, 1] -> ∓ the same z; [1, NaN]: one valid value -> 0, NaN stays NaN.
    R = 2 z_a + 1 z_b (no division by the weights)."""
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    fusion = RewardFusion([source("a", 2.0), source("b", 1.0)], aggregation="normalize_then_sum")
    result = fusion.fuse({"a": batch(1, 0, 2, 2), "b": batch(0, 1, 1, None)}, group_size=2)
    assert result.normalized["a"] == pytest.approx([z, -z, 0.0, 0.0])
    assert result.normalized["b"][:3] == pytest.approx([-z, z, 0.0]) and math.isnan(result.normalized["b"][3])
    assert result.fused == pytest.approx([2 * z - z, -2 * z + z, 0.0, 0.0])
    # x_i = w_i z_i: Cov shares still sum to 1. R = [z, −z, 0, 0]; x_a = [2z, −2z, 0, 0] -> c_a = 2, c_b = −1
    assert result.weight_effect["a"] == pytest.approx(2.0)
    assert result.weight_effect["b"] == pytest.approx(-1.0)
    with pytest.raises(GrpoError, match="aggregation"):
        RewardFusion([source("a")], aggregation="sum")


# ---- checkpoints ---------------------------------------------------------------------------------
def test_state_dict_round_trips_running_stats_and_failure_counts():
    sources = [source("rm", normalize="zscore"), source("flaky", fallback="rm")]
    first = RewardFusion(sources, max_consecutive_failures=3)
    first.fuse({"rm": batch(1, 3), "flaky": batch(None, None, error="E: x")}, 2)
    first.fuse({"rm": batch(5, 7), "flaky": batch(None, None, error="E: x")}, 2)
    state = json.loads(json.dumps(first.state_dict()))  # plain Python: fits in a checkpoint's JSON
    assert state["stats"]["rm"]["mean"] == pytest.approx(2.4) and state["stats"]["rm"]["var"] == pytest.approx(2.44)
    assert state["failures"] == {"rm": 0, "flaky": 2}

    resumed = RewardFusion(sources, max_consecutive_failures=3)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == first.state_dict()
    nxt = {"rm": batch(2, 4), "flaky": batch(None, None, error="E: x")}
    a, b = first.fuse(nxt, 2), resumed.fuse(nxt, 2)
    assert a.normalized == b.normalized and a.fused == b.fused
    assert b.masked == ["flaky"]  # the third failure in a row counts across the resume


# ---- zscore momentum per function ----------------------------------------------------------------
def test_per_function_ema_momentum_reaches_the_zscore_stats():
    """Both seeded by batch 1 [1, 3]: mean 2, var 1. Batch 2 [5, 7]: batch mean 6, var 1, shift 4.
    a (own m 0.5): mean .5·2 + .5·6 = 4, var .5 + .5 + .25·16 = 5 -> z(5) = 1/(√5 + 1e-4).
    b (unset: reward.ema_momentum 0.75): mean .75·2 + .25·6 = 3, var 1 + .1875·16 = 4 -> z(5) = 2/(2 + 1e-4)."""
    reward = RewardConfig(
        functions=[
            spec("a", "exact_match", normalize="zscore", ema_momentum=0.5),
            spec("b", "exact_match", normalize="zscore"),
        ],
        ema_momentum=0.75,
    )
    sources = resolve_reward_sources(reward.functions)
    assert [s.ema_momentum for s in sources] == [0.5, None]
    fusion = RewardFusion(sources, reward.max_consecutive_failures, reward.aggregation, reward.ema_momentum)
    assert [fusion.momentum(s) for s in sources] == [0.5, 0.75]
    fusion.fuse({"a": batch(1, 3), "b": batch(1, 3)}, 2)
    result = fusion.fuse({"a": batch(5, 7), "b": batch(5, 7)}, 2)
    assert result.normalized["a"] == pytest.approx([1 / (math.sqrt(5) + 1e-4), 3 / (math.sqrt(5) + 1e-4)])
    assert result.normalized["b"] == pytest.approx([2 / (2 + 1e-4), 4 / (2 + 1e-4)])
    stats = fusion.state_dict()["stats"]
    assert (stats["a"]["mean"], stats["a"]["var"]) == pytest.approx((4.0, 5.0))
    assert (stats["b"]["mean"], stats["b"]["var"]) == pytest.approx((3.0, 4.0))


def test_ema_momentum_outside_0_1_is_refused_naming_the_key():
    with pytest.raises(GrpoError, match=r"reward 'a': ema_momentum 1.0 must be in \[0, 1\)"):
        resolve_reward_sources([spec("a", "exact_match", ema_momentum=1.0)])
    with pytest.raises(GrpoError, match=r"reward.ema_momentum 1.5 must be in \[0, 1\)"):
        RewardFusion([source("a")], ema_momentum=1.5)
    bad_default = TrainConfig(reward=RewardConfig(ema_momentum=1.0))
    with pytest.raises(GrpoError, match=r"invalid value reward.ema_momentum=1.0: must be in \[0, 1\)"):
        validate(bad_default)
    bad_function = TrainConfig(reward=RewardConfig(functions=[spec("a", "exact_match", ema_momentum=-0.1)]))
    with pytest.raises(GrpoError, match=r"invalid value reward.functions\[0\].ema_momentum=-0.1: must be in"):
        validate(bad_function)


def correct(prompts, completions, answer, **_):
    """1 when the number after "so " is the answer; raises on one it cannot parse (a strict scorer)."""
    return score_each(lambda c, a: float(int(c.split("so ")[1]) == int(a)), completions, answer)


def formatted(prompts, completions, **_):
    """Every completion has the "so N" shape here: 1.0 for all."""
    return [1.0] * len(completions)


def fuse_so_answers(on_row_error):
    functions = [
        spec("correct", "tests.rewards.test_fusion:correct", on_row_error=on_row_error),
        spec("formatted", "tests.rewards.test_fusion:formatted", weight=0.2),
    ]
    batch = RewardBatch.from_groups([{"prompt": "2+2=", "answer": "4"}], ["so 4", "so 5", "so x", "so 3"], [2] * 4, 4)
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        return score_and_fuse(executor, RewardFusion(resolve_reward_sources(functions)), batch)


def test_a_completion_that_makes_the_scorer_raise_scores_its_floor_not_a_tie_with_the_right_answer():
    """Issue 33 item 2: "so x" made `correct` raise, was judged on `formatted` alone and fused to 1.0,
    the right answer's reward. With on_row_error=zero (the default) it scores correct's floor, 0."""
    result = fuse_so_answers("zero")
    assert [round(r, 3) for r in result.fused] == [1.0, 0.167, 0.167, 0.167]
    assert result.per_function["correct"] == [1.0, 0.0, 0.0, 0.0]
    assert result.alerts == [
        "reward 'correct' raised on 1 of 4 completions: scored 0 for them (on_row_error=zero); the rest of its "
        "batch stands (row 2: ValueError: invalid literal for int() with base 10: 'x')"
    ]
    skipped = fuse_so_answers("skip")  # the seeds' rule, on request: the functions that judged the row
    assert [round(r, 3) for r in skipped.fused] == [1.0, 0.167, 1.0, 0.167]


def test_a_none_returned_on_purpose_is_still_left_to_the_other_functions():
    """Only a raised row takes the floor: a None is the function declining to judge (NaN-safe mean)."""
    sources = [RewardSource("declines", lambda p, c, **_: [None, 1.0]), RewardSource("b", lambda p, c, **_: [0.5, 0.5])]
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        result = score_and_fuse(executor, RewardFusion(sources), RewardBatch(["p", "p"], ["a", "b"], {}, 2))
    assert result.fused == [0.5, 0.75] and result.raw == [0.5, 0.75]


def test_on_row_error_takes_zero_or_skip_only():
    with pytest.raises(GrpoError, match="reward 'correct': on_row_error 'floor' is not one of zero, skip"):
        resolve_reward_sources([spec("correct", "tests.rewards.test_fusion:correct", on_row_error="floor")])


def test_the_raw_reward_is_the_weighted_mean_over_the_functions_that_scored_the_row():
    """FusionResult.raw, the one definition the clip, guard, hacking alert and sweeps read: a row one
    function could not score is the others' weighted mean (the denominator over the valid ones)."""
    fusion = RewardFusion([source("a", 3.0), source("b", 1.0, normalize="zscore")])
    result = fusion.fuse({"a": batch(1, None, 0, 1), "b": batch(0, 0.5, 1, None)}, group_size=2)
    assert result.raw == [0.75, 0.5, 0.25, 1.0]


def test_the_raw_reward_keeps_the_configured_weights_when_a_curriculum_moves_them():
    """Issue 33 item 7: reward/raw_mean jumped at a phase change ({a: 1, b: 0} to {a: 0, b: 1} turned
    1.0 into 0.0 with the same completions), and the adaptive clip and the hacking alert read the
    jump as the policy's. The raw reward stays under the configured weights; the fused one follows
    the curriculum."""
    fusion = RewardFusion([source("a"), source("b")])
    scores = {"a": batch(1, 1), "b": batch(0, 0)}
    before, after = (fusion.fuse(scores, 2, weights) for weights in ({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}))
    assert (before.fused, after.fused) == ([1.0, 1.0], [0.0, 0.0])
    assert before.raw == after.raw == [0.5, 0.5]
    fusion.masked.append("b")  # masking still moves a weight to its fallback (none here: b's is dropped)
    assert fusion.fuse(scores, 2, {"a": 0.0, "b": 1.0}).raw == [1.0, 1.0]


def test_a_constant_group_z_scores_exactly_zero_whatever_its_mean_rounds_to():
    """0.1 + 0.1 + 0.1 is not 0.3: without the constant-group rule a group of 0.1s z-scores about
    1e-13, a signal where there is none (group_zscore; the advantage is the same function)."""
    fusion = RewardFusion([source("a", normalize="group_zscore")])
    assert fusion.fuse({"a": batch(0.1, 0.1, 0.1, 1, 2, 3)}, group_size=3).fused[:3] == [0.0, 0.0, 0.0]
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0, 3.0])
    advantages, stats = group_advantages(rewards, 3)
    assert advantages[:3].tolist() == [0.0, 0.0, 0.0] and stats.frac_zero_std_groups == 0.5


def test_a_reward_that_returns_text_says_so_in_its_error():
    """Issue 33 item 16: a function returning strings was reported as "none raised (the function
    returned None/NaN)"; its error now names the first value that was not a number."""
    sources = [RewardSource("texty", lambda p, c, **_: ["0.5", 1.0])]
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        result = score_and_fuse(executor, RewardFusion(sources), RewardBatch(["p", "p"], ["a", "b"], {}, 2))
    assert result.errors == {"texty": "row 0 is str '0.5', not a number"}
    assert nan_rate_alerts(result, 0.5) == [
        "reward texty returned NaN for 50% of the batch (monitor.nan_alert=0.5); first error: row 0 is str '0.5', "
        "not a number"
    ]
