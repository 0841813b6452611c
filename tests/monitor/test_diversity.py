"""Diversity, repetition and the repetition alert, on batches whose answers are worked by hand."""

from __future__ import annotations

import math

import pytest

from grpo_cli.monitor.diversity import RepetitionAlert, distinct_n, diversity_metrics, repetition_rate


def test_distinct2_of_a_known_batch():
    # bigrams: (1,2) (2,3) | (1,2) (2,4) | (5,5) (5,5): 4 distinct of 6
    assert distinct_n([[1, 2, 3], [1, 2, 4], [5, 5, 5]]) == pytest.approx(4 / 6)
    assert distinct_n([[1, 2, 3]], n=3) == 1.0
    assert math.isnan(distinct_n([[1], [2]]))  # no bigram at all: undefined, not 0 or 1


def test_diversity_within_groups_over_the_batch_and_identical_groups():
    seqs = [
        [1, 2, 3],
        [1, 2, 3],  # group 0: identical, bigrams 12 23 12 23 -> 2/4
        [4, 5, 6],
        [6, 5, 4],  # group 1: 45 56 65 54 -> 4/4
    ]
    metrics = diversity_metrics(seqs, group_size=2)
    assert metrics["diversity/distinct2_group"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["diversity/distinct2_batch"] == pytest.approx(6 / 8)
    assert metrics["diversity/frac_identical_groups"] == 0.5


def test_repetition_rate_counts_ngrams_seen_earlier_in_the_same_completion():
    # [7]*6: 4 trigrams, all "777": 3 repeats of 4; [1, 2, 3, 1, 2, 3]: 123 231 312 123 -> 1 of 4
    assert repetition_rate([[7] * 6, [1, 2, 3, 1, 2, 3]]) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert repetition_rate([[1, 2, 3, 4], [9, 9]]) == 0.0  # the 2-token completion has no trigram
    assert math.isnan(repetition_rate([[1, 2], []]))


def test_repetition_alert_fires_on_a_jump_not_on_a_steady_rate():
    steady = RepetitionAlert(0.2)
    assert [steady.observe(r) for r in [0.6, 0.62, 0.58, 0.61, 0.6, 0.59] * 5] == [None] * 30  # high but steady

    jump = RepetitionAlert(0.2)
    assert [jump.observe(r) for r in (0.05, 0.07, 0.04, 0.06)] == [None] * 4
    message = jump.observe(0.5)
    assert message is not None and "0.50" in message
    assert jump.observe(math.nan) is None  # a batch with no trigram says nothing


def test_repetition_alert_says_a_steady_climb_once():
    """The tiny #### run's rate climbed 0.31, 0.36, 0.38, ... for steps on end, each step above
    the lagging mean: one alert, not one per step; a new jump after it settles is said again."""
    climb = RepetitionAlert(0.2)
    said = [climb.observe(r) for r in (0.05, 0.06, 0.05, 0.31, 0.36, 0.38, 0.39, 0.43, 0.45)]
    assert sum(m is not None for m in said) == 1 and said[3] is not None
    settled = [climb.observe(0.45) for _ in range(20)]
    assert settled == [None] * 20
    assert climb.observe(0.9) is not None

    off = RepetitionAlert(0.0)  # monitor.repetition_alert=0: off
    assert [off.observe(r) for r in (0.0, 1.0)] == [None, None]


def test_repetition_alert_resumes_with_its_running_mean():
    original = RepetitionAlert(0.2)
    for rate in (0.1, 0.1, 0.1):
        original.observe(rate)
    resumed = RepetitionAlert(0.2)
    resumed.load_state_dict(original.state_dict())
    assert resumed.observe(0.45) == original.observe(0.45) is not None
