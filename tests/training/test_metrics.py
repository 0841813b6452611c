"""The raw reward (issue 21 item 2): a normalised fusion centres the fused reward near 0 in every
batch, so the adaptive clip, the stability guard and the sweep objective read the weighted raw
reward under the effective weights, logged as reward/raw_mean beside the fused reward/mean."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from grpo_cli.commands.train import run_train
from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from tests.conftest import read_metrics

WEIGHTS = {"exact_match": 1.0, "partial_credit": 3.0}


def normalised_config(steps: int) -> TrainConfig:
    """The default task fused by `normalize_then_sum`: its fused batch mean is 0 by construction."""
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 4, 4
    cfg.data.num_examples = 200
    cfg.monitor.console, cfg.monitor.plots = "quiet", False
    cfg.reward.aggregation = "normalize_then_sum"
    cfg.reward.functions = [
        RewardFunctionConfig(name="exact_match", target="exact_match", weight=WEIGHTS["exact_match"]),
        RewardFunctionConfig(name="partial_credit", target="answer_partial_credit", weight=WEIGHTS["partial_credit"]),
    ]
    cfg.algo.adaptive_clip.enabled = True
    cfg.algo.adaptive_clip.alpha, cfg.algo.adaptive_clip.min, cfg.algo.adaptive_clip.max = 0.4, 0.01, 0.9
    return cfg


def test_clip_guard_metrics_and_the_sweep_objective_read_the_raw_reward(tmp_path: Path) -> None:
    cfg = normalised_config(steps=4)
    cfg.guard.reward_cv_threshold, cfg.guard.patience = 0.01, 100  # every raw batch counts, none triggers
    objective = run_train(cfg, tmp_path)
    rows = read_metrics(tmp_path)
    raw_means = []
    for row in rows:
        # every completion scored by both functions: the weighted raw mean is the weighted function means
        expected = sum(w * row[f"reward/{fn}/mean"] for fn, w in WEIGHTS.items()) / sum(WEIGHTS.values())
        assert row["reward/raw_mean"] == pytest.approx(expected, rel=1e-9)
        assert abs(row["reward/mean"]) < 1e-6 < row["reward/raw_mean"]  # the fused mean says nothing
        assert row["guard/reward_cv"] == pytest.approx(row["reward/raw_std"] / row["reward/raw_mean"], rel=1e-9)
        raw_means.append(row["reward/raw_mean"])
    assert [row["guard/cv_streak"] for row in rows] == [1, 2, 3, 4]  # the fused CV is undefined: 0s
    assert len(set(raw_means)) > 2  # the steps differ, so the clip has a trend to follow
    clip = cfg.algo.adaptive_clip
    for k in (2, 3):  # from the third step: ε from the previous raw means (core.clip's formula)
        window = raw_means[:k]
        z = (raw_means[k] - statistics.fmean(window)) / statistics.stdev(window)
        expected = min(max(clip.base * (1 + clip.alpha * z), clip.min), clip.max)
        assert rows[k]["clip/epsilon_low"] == pytest.approx(expected, rel=1e-9)
    assert rows[2]["clip/epsilon_low"] != clip.base or rows[3]["clip/epsilon_low"] != clip.base
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reward_last10"] == pytest.approx(statistics.fmean(raw_means), rel=1e-9)
    assert objective == summary["reward_last10"]  # sweep.objective's default
