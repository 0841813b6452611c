"""Group-relative advantages, checked against docs/architecture.md §3 worked out by hand.

A_i = (r_i - mean_g) / (std_g + 1e-4), std unbiased (n - 1).
"""

import math
import statistics

import pytest
import torch

from grpo_cli.core.advantages import group_advantages

NAN = float("nan")
EPS = 1e-4


def _expected(rewards, mean, std):
    return [(r - mean) / (std + EPS) for r in rewards]


def test_group_scale_uses_unbiased_group_std():
    """Default `group` scaling: centre by the group mean, divide by the (n-1) group std + 1e-4."""
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 1.0, 3.0])
    adv, stats = group_advantages(rewards, group_size=4)

    # Group 1: mean 2.5, squared deviations 2.25+0.25+0.25+2.25 = 5, var = 5/3.
    g1 = _expected([1, 2, 3, 4], 2.5, math.sqrt(5 / 3))
    # Group 2: mean 1, squared deviations 1+1+0+4 = 6, var = 6/3 = 2.
    g2 = _expected([0, 0, 1, 3], 1.0, math.sqrt(2))
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(g1 + g2, rel=1e-6)
    assert stats.frac_zero_std_groups == 0.0
    assert stats.unscorable_indices == []
    assert stats.reward_std_mean == pytest.approx((math.sqrt(5 / 3) + math.sqrt(2)) / 2, rel=1e-9)


def test_group_scale_is_not_population_std():
    """The denominator is the sample std (n-1, as TRL), not the population std (n)."""
    adv, _ = group_advantages(torch.tensor([0.0, 1.0]), group_size=2)
    # mean 0.5; unbiased var = (0.25 + 0.25) / 1 = 0.5 -> std = sqrt(0.5) ~ 0.7071.
    # (population std would be 0.5, giving +-1.)
    expected = 0.5 / (math.sqrt(0.5) + EPS)
    assert adv.tolist() == pytest.approx([-expected, expected], rel=1e-6)


def test_batch_scale_divides_by_whole_batch_std_but_centres_per_group():
    """`batch`: the mean stays per group, the std is over every reward in the batch."""
    g1, g2 = [1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 12.0, 16.0]
    adv, _ = group_advantages(torch.tensor(g1 + g2), group_size=4, scale_rewards="batch")
    batch_std = statistics.stdev(g1 + g2)  # unbiased, over all 8 values
    expected = _expected(g1, 2.5, batch_std) + _expected(g2, 12.0, batch_std)
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_none_scale_only_centres():
    """`none` (Dr. GRPO): A = r - mean_g, no division."""
    rewards = torch.tensor([1.0, 2.0, 6.0, 3.0, 3.0, 9.0])
    adv, _ = group_advantages(rewards, group_size=3, scale_rewards="none")
    assert adv.tolist() == pytest.approx([1 - 3, 2 - 3, 6 - 3, 3 - 5, 3 - 5, 9 - 5], rel=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_gives_exact_zero(scale):
    """All-equal rewards carry no signal: exactly 0.0 (no float noise from 0.1's rounding)."""
    # 0.1 is not representable: (0.1+0.1+0.1)/3 != 0.1 in floating point.
    assert (0.1 + 0.1 + 0.1) / 3 != 0.1
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.5], dtype=torch.float64)
    adv, stats = group_advantages(rewards, group_size=3, scale_rewards=scale)
    assert adv[:6].tolist() == [0.0] * 6
    assert stats.frac_zero_std_groups == pytest.approx(2 / 3)
    # The third group still gets a signal.
    assert adv[6] < 0 < adv[7]
    assert adv[8] == pytest.approx(0.0, abs=1e-6)


def test_nan_rewards_are_left_out_of_group_stats_and_get_zero():
    """Unscorable completions: excluded from mean/std, advantage 0, index reported."""
    rewards = torch.tensor([1.0, NAN, 3.0, 5.0, 2.0, 4.0, NAN, 0.0])
    adv, stats = group_advantages(rewards, group_size=4)
    # Group 1 valid: [1, 3, 5] -> mean 3, var (4+0+4)/2 = 4, std 2.
    # Group 2 valid: [2, 4, 0] -> mean 2, var (0+4+4)/2 = 4, std 2.
    d = 2 / (2 + EPS)
    expected = [-d, 0.0, 0.0, d, 0.0, d, 0.0, -d]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert adv[1].item() == 0.0 and adv[6].item() == 0.0
    assert not torch.isnan(adv).any()
    assert stats.unscorable_indices == [1, 6]
    assert stats.frac_zero_std_groups == 0.0


def test_nan_rewards_are_left_out_of_batch_std():
    """`batch` scaling ignores NaN rewards in the batch-wide std too."""
    g1, g2 = [1.0, NAN, 3.0, 5.0], [2.0, 7.0, NAN, 0.0]
    adv, stats = group_advantages(torch.tensor(g1 + g2), group_size=4, scale_rewards="batch")
    batch_std = statistics.stdev([1.0, 3.0, 5.0, 2.0, 7.0, 0.0])
    expected = [
        (1 - 3) / (batch_std + EPS),
        0.0,
        0.0,
        (5 - 3) / (batch_std + EPS),
        (2 - 3) / (batch_std + EPS),
        (7 - 3) / (batch_std + EPS),
        0.0,
        (0 - 3) / (batch_std + EPS),
    ]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert stats.unscorable_indices == [1, 6]


def test_single_valid_member_and_all_nan_groups_give_zero():
    """A group with < 2 scorable answers has no spread to learn from: all zeros, never NaN."""
    rewards = torch.tensor([NAN, 7.0, NAN, NAN, NAN, NAN, 1.0, 2.0, 3.0])
    for scale in ("group", "batch", "none"):
        adv, stats = group_advantages(rewards, group_size=3, scale_rewards=scale)
        assert adv[:6].tolist() == [0.0] * 6
        assert not torch.isnan(adv).any()
        assert stats.unscorable_indices == [0, 2, 3, 4, 5]
    adv, _ = group_advantages(rewards, group_size=3)
    d = 1 / (1 + EPS)  # group [1, 2, 3]: mean 2, std 1
    assert adv[6:].tolist() == pytest.approx([-d, 0.0, d], rel=1e-6, abs=1e-7)


def test_rewards_not_splitting_into_groups_is_an_error():
    """A batch that is not a whole number of groups is refused, not silently mis-grouped."""
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(7), group_size=4)


def test_unknown_scale_rewards_is_an_error():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([0.0, 1.0]), group_size=2, scale_rewards="nope")
