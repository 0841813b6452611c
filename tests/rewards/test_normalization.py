"""Per-function normalisation (docs/architecture.md §3): none, zscore (EMA), sigmoid, group_zscore; NaN stays NaN."""

from __future__ import annotations

import math

import pytest

from grpo_cli.rewards import BatchScores, RewardFusion, RewardSource

NAN = math.nan
EPS = 1e-4  # the advantage's epsilon, also used by the z-scores


def fuse_one(fusion, values, group_size=1, **kwargs):
    """Normalised values of the single source "f" for one batch."""
    scores = BatchScores([NAN if v is None else float(v) for v in values])
    return fusion.fuse({"f": scores}, group_size, **kwargs).normalized["f"]


def make(normalize, **kwargs):
    return RewardFusion([RewardSource("f", lambda p, c, **_: [], normalize=normalize)], **kwargs)


def test_none_is_identity_and_keeps_nan():
    out = fuse_one(make("none"), [2.5, None, -1.0])
    assert out[0] == 2.5 and math.isnan(out[1]) and out[2] == -1.0


def test_sigmoid():
    """1/(1+e^-x): 0 -> 1/2, ln 3 -> 1/(1+1/3) = 3/4, -ln 3 -> 1/4; huge inputs do not overflow."""
    out = fuse_one(make("sigmoid"), [0.0, math.log(3), -math.log(3), None, 1000.0, -1000.0])
    assert out[:3] == pytest.approx([0.5, 0.75, 0.25])
    assert math.isnan(out[3]) and out[4] == 1.0 and out[5] == 0.0


def test_zscore_ema_seeded_by_first_batch_and_applied_with_the_current_batch():
    """Batch 1 [1, 3]: seeds mean 2, var 1 (population) -> z = ∓1/(1 + 1e-4).
    Batch 2 [5, 7]: batch mean 6, var 1; mean = .9·2 + .1·6 = 2.4;
    var = .9·1 + .1·1 + .9·.1·(6 − 2)² = 1 + 1.44 = 2.44 -> z(5) = 2.6/(√2.44 + 1e-4).
    NaN values neither move the stats nor get a score."""
    fusion = make("zscore")
    first = fuse_one(fusion, [1, 3, None], group_size=3)
    assert first[:2] == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS)]) and math.isnan(first[2])
    second = fuse_one(fusion, [5, 7, None], group_size=3)
    std = math.sqrt(2.44)
    assert second[:2] == pytest.approx([2.6 / (std + EPS), 4.6 / (std + EPS)])
    state = fusion.state_dict()["stats"]["f"]
    assert (state["mean"], state["var"]) == (pytest.approx(2.4), pytest.approx(2.44))


def test_zscore_all_nan_batch_leaves_stats_alone():
    fusion = make("zscore")
    fuse_one(fusion, [1, 3])
    fuse_one(fusion, [None, None])
    assert fusion.state_dict()["stats"]["f"]["mean"] == 2.0


def test_zscore_read_only_call_does_not_move_stats():
    """update_state=False (evaluation) uses the stats without updating them."""
    fusion = make("zscore")
    fuse_one(fusion, [1, 3])
    out = fuse_one(fusion, [5], update_state=False)
    assert out == pytest.approx([3 / (1 + EPS)])
    assert fusion.state_dict()["stats"]["f"] == {"mean": 2.0, "var": 1.0, "seeded": True}


def test_group_zscore_per_group_with_zero_std_group_and_nan():
    """Groups of 3. [1, 2, 3]: mean 2, unbiased std 1 -> ∓1/(1 + 1e-4), 0.
    [5, 5, 5]: zero std -> 0. [4, NaN, 6]: mean 5, std √2 -> ∓1/(√2 + 1e-4), NaN stays."""
    out = fuse_one(make("group_zscore"), [1, 2, 3, 5, 5, 5, 4, None, 6], group_size=3)
    k = 1 / (math.sqrt(2) + EPS)
    assert out[:6] == pytest.approx([-1 / (1 + EPS), 0.0, 1 / (1 + EPS), 0.0, 0.0, 0.0])
    assert out[6] == pytest.approx(-k) and math.isnan(out[7]) and out[8] == pytest.approx(k)


def test_batch_must_be_whole_groups():
    with pytest.raises(ValueError, match="whole number of groups"):
        fuse_one(make("group_zscore"), [1, 2, 3], group_size=2)
