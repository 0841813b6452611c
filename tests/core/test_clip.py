"""Adaptive clipping (docs/architecture.md §3, seed 001): ε_t = base·(1 + α·(R_t − R̄)/σ_R) over the previous
`window` batch means, clamped to [min, max]; ε_high keeps its ratio to ε_low. Worked numbers."""

from __future__ import annotations

import json
import math

import pytest

from grpo_cli.config.schema import AdaptiveClipConfig, AlgoConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.core.clip import AdaptiveClip, widest_epsilon_high
from grpo_cli.errors import GrpoError

NAN = math.nan


def make(epsilon_low=0.2, epsilon_high=0.2, **cfg):
    """base 0.15, α 0.4, window 3 (so a mean drops out within the test), min 0.05, max 0.3."""
    return AdaptiveClip(AdaptiveClipConfig(enabled=True, window=3, **cfg), epsilon_low, epsilon_high)


def feed(clip, *means):
    return [clip.epsilons(m) for m in means]


def test_disabled_returns_the_configured_epsilons():
    clip = AdaptiveClip(AdaptiveClipConfig(), epsilon_low=0.2, epsilon_high=0.28)
    assert feed(clip, 0.1, 0.9, 0.2, NAN) == [(0.2, 0.28)] * 4
    assert clip.state_dict()["window"] == []


def test_base_until_two_previous_batches_are_seen():
    """Step 1 has no previous mean, step 2 one: σ_R needs two."""
    assert feed(make(), 0.2, 0.4) == [(0.15, 0.15), (0.15, 0.15)]


def test_a_window_of_worked_numbers():
    """Step 3, R 0.5 over [0.2, 0.4]: R̄ 0.3, σ √0.02 = 0.141421 -> z √2, ε = .15(1 + .4√2) = 0.234853.
    Step 4, R 0.3 over [0.2, 0.4, 0.5]: R̄ 0.366667, σ² = (.027778 + .001111 + .017778)/2 = .023333,
    σ 0.152753 -> z −0.436436, ε = .15(1 − .174574) = 0.123814.
    Step 5, R 0.6 over [0.4, 0.5, 0.3] (0.2 left the window of 3): R̄ 0.4, σ 0.1 -> z 2, ε = .15·1.8 = 0.27."""
    steps = feed(make(), 0.2, 0.4, 0.5, 0.3, 0.6)
    assert [low for low, _ in steps] == pytest.approx([0.15, 0.15, 0.234853, 0.123814, 0.27], abs=1e-6)
    assert steps[2][0] == pytest.approx(0.15 * (1 + 0.4 * math.sqrt(2)))


def test_clamped_to_min_and_max():
    """Over [0.4, 0.5, 0.3] (R̄ 0.4, σ 0.1): R 0 -> z −4, .15(1 − 1.6) = −0.09 -> min 0.05;
    R 1 -> z 6, .15(1 + 2.4) = 0.51 -> max 0.3."""
    low, high = make(), make()
    feed(low, 0.4, 0.5, 0.3)
    feed(high, 0.4, 0.5, 0.3)
    assert low.epsilons(0.0) == pytest.approx((0.05, 0.05))
    assert high.epsilons(1.0) == pytest.approx((0.3, 0.3))


def test_clip_higher_scales_the_upper_bound_by_the_same_factor():
    """epsilon_low 0.2, epsilon_high 0.28 (DAPO): ratio 1.4. Base pair (0.15, 0.21); z 2 -> f 1.8:
    (0.27, 0.378); clamped at max 0.3 the upper bound is 0.3·1.4 = 0.42 (only ε_low is clamped)."""
    clip = make(epsilon_low=0.2, epsilon_high=0.28)
    steps = feed(clip, 0.4, 0.5, 0.3, 0.6)
    assert steps[0] == pytest.approx((0.15, 0.21))
    assert steps[3] == pytest.approx((0.27, 0.378))
    assert clip.epsilons(5.0) == pytest.approx((0.3, 0.42))


def test_a_flat_window_gives_factor_one():
    """σ_R = 0 (equal means, or float noise around equal means): ε = base, not a division by zero."""
    assert make().epsilons(0.1) == (0.15, 0.15)
    assert feed(make(), 0.5, 0.5, 0.9)[2] == (0.15, 0.15)
    assert feed(make(), 0.1, 0.1, 0.1, 0.7)[3] == (0.15, 0.15)  # σ of [0.1]·3 is ~1e-17, not 0


def test_a_nan_batch_mean_repeats_the_last_pair_and_leaves_the_window():
    clip = make(epsilon_low=0.2, epsilon_high=0.28)
    assert clip.epsilons(NAN) == (0.15, pytest.approx(0.21))  # nothing yet: the base pair
    assert clip.state_dict()["window"] == []
    steps = feed(clip, 0.4, 0.5, 0.3, 0.6)
    window = clip.state_dict()["window"]
    assert clip.epsilons(NAN) == steps[-1]
    assert clip.state_dict()["window"] == window == pytest.approx([0.5, 0.3, 0.6])
    # the next step sees the same window as without the NaN batch: R 0.7 over [0.5, 0.3, 0.6]
    without = make(epsilon_low=0.2, epsilon_high=0.28)
    feed(without, 0.4, 0.5, 0.3, 0.6)
    assert clip.epsilons(0.7) == without.epsilons(0.7)


def test_state_dict_round_trip_resumes_identically():
    means = [0.1, 0.3, 0.2, 0.6, 0.4, NAN, 0.5, 0.8, 0.2]
    first = make(epsilon_low=0.2, epsilon_high=0.28)
    feed(first, *means[:6])  # ends on the NaN batch: `last` must survive too
    state = json.loads(json.dumps(first.state_dict()))  # plain Python: fits in a checkpoint's JSON
    resumed = make(epsilon_low=0.2, epsilon_high=0.28)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == first.state_dict()
    assert resumed.epsilons(NAN) == first.epsilons(NAN)
    assert feed(resumed, *means[6:]) == feed(first, *means[6:])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("window", 1, r"algo\.adaptive_clip\.window=1: must be at least 2"),
        ("alpha", -0.1, r"algo\.adaptive_clip\.alpha=-0\.1: must be >= 0"),
        ("base", 0.0, r"algo\.adaptive_clip\.base=0\.0: must be > 0"),
        ("min", 0.2, r"algo\.adaptive_clip\.min=0\.2: must be <= algo\.adaptive_clip\.base"),
        ("max", 0.1, r"algo\.adaptive_clip\.base=0\.15: must be <= algo\.adaptive_clip\.max"),
        ("max", 1.0, r"algo\.adaptive_clip\.max=1\.0: must be < 1"),
    ],
)
def test_validation_names_the_key(field, value, message):
    cfg = TrainConfig(algo=AlgoConfig(adaptive_clip=AdaptiveClipConfig(**{field: value})))
    with pytest.raises(GrpoError, match=message):
        validate(cfg)


def test_enabling_it_on_a_preset_of_another_scale_warns():
    """GSPO clips at 3e-4: the default base 0.15 would loosen it 500-fold."""
    gspo = AlgoConfig(epsilon_low=3e-4, epsilon_high=4e-4, adaptive_clip=AdaptiveClipConfig(enabled=True))
    assert any("algo.adaptive_clip.base=0.15 replaces" in w for w in validate(TrainConfig(algo=gspo)))
    assert validate(TrainConfig(algo=AlgoConfig(adaptive_clip=AdaptiveClipConfig(enabled=True)))) == []


def test_the_widest_epsilon_high_is_the_one_paired_with_the_ceiling_and_is_reached():
    """epsilon 0.2/0.28, max 0.3: a batch far above the trend drives ε_t to its ceiling, where ε_high is
    0.3·0.28/0.2 = 0.42, and no series of batch means goes past it."""
    clip = make(epsilon_high=0.28)
    pairs = feed(clip, 0.1, 0.2, 0.1, 5.0) + feed(make(epsilon_high=0.28), *[(-1) ** i * i for i in range(20)])
    widest = widest_epsilon_high(clip.cfg, 0.2, 0.28)
    assert widest == pytest.approx(0.42)
    assert pairs[3] == pytest.approx((0.3, widest))  # reached
    assert max(high for _, high in pairs) == pytest.approx(widest)
    assert widest_epsilon_high(AdaptiveClipConfig(), 0.2, 0.28) == 0.28  # disabled: the configured bound


def test_delta_must_clear_the_widest_epsilon_high_the_adaptive_clip_reaches():
    """delta 1.3 clears epsilon_high 0.28, but the adaptive clip widens it to 0.42: with it on, the
    cap would sit inside the clip range, no longer TRL's two-sided clip. Refused at start-up, naming
    the bound; 1.5 passes."""
    cfg = TrainConfig()
    cfg.algo.epsilon_high, cfg.algo.delta = 0.28, 1.3
    assert validate(cfg) == []
    cfg.algo.adaptive_clip.enabled = True
    with pytest.raises(GrpoError, match=r"algo\.delta=1\.3: must be > 1\.42 \(1 \+ algo\.adaptive_clip\.max·"):
        validate(cfg)
    cfg.algo.delta = 1.5
    assert validate(cfg) == []
