"""Adaptive clipping: the PPO clip range follows the reward trend (docs/architecture.md §3, seed 001).

ε_t = base · (1 + α·(R_t − R̄)/σ_R), clamped to [min, max]. R_t is this step's batch mean reward;
R̄ and σ_R are the mean and unbiased std of the previous `window` batch means (R_t not among them).
The trainer passes the raw reward's mean (rewards.FusionResult.raw): a normalised fused reward
is centred near 0 in every batch, and ε would never move.
A batch better than the recent trend widens the trust region, a worse one narrows it.

Clip-higher rule: ε_t replaces `algo.epsilon_low`, and the upper bound keeps its configured ratio,
ε_high_t = ε_t · epsilon_high/epsilon_low. Equivalently the factor f = ε_t/base scales the pair
(base, base·epsilon_high/epsilon_low), so both bounds move by the same factor; only ε_low is clamped
(the upper bound is at most max·epsilon_high/epsilon_low).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from grpo_cli.config.schema import AdaptiveClipConfig
from grpo_cli.stats import MIN_VARIANCE, nanmean, nanstd


def paired_epsilon_high(epsilon: float, epsilon_low: float, epsilon_high: float) -> float:
    """The upper bound that goes with ε_t: the configured clip-higher ratio kept."""
    return epsilon * epsilon_high / epsilon_low


def widest_epsilon_high(cfg: AdaptiveClipConfig, epsilon_low: float, epsilon_high: float) -> float:
    """The widest ε_high a run can clip at: the configured one, or with adaptive clipping the one
    paired with ε_t at its ceiling `max` (what algo.delta must exceed to stay TRL's two-sided clip).

    >>> round(widest_epsilon_high(AdaptiveClipConfig(enabled=True, max=0.3), 0.2, 0.28), 4)
    0.42
    """
    return paired_epsilon_high(cfg.max, epsilon_low, epsilon_high) if cfg.enabled else epsilon_high


class AdaptiveClip:
    """Stateful across steps: the window of previous batch means, which a checkpoint must keep.

    >>> clip = AdaptiveClip(AdaptiveClipConfig(enabled=True), epsilon_low=0.2, epsilon_high=0.28)
    >>> clip.epsilons(0.2), clip.epsilons(0.4)  # fewer than two previous means: base
    ((0.15, 0.21), (0.15, 0.21))
    >>> [round(e, 4) for e in clip.epsilons(0.5)]  # R̄ 0.3, σ 0.1414: 0.15·(1 + 0.4·1.4142)
    [0.2349, 0.3288]
    """

    def __init__(self, cfg: AdaptiveClipConfig, epsilon_low: float, epsilon_high: float) -> None:
        self.cfg = cfg
        self.epsilon_low = float(epsilon_low)
        self.epsilon_high = float(epsilon_high)
        self.window: deque[float] = deque(maxlen=cfg.window)  # previous finite batch means, oldest first
        self.last: tuple[float, float] | None = None  # the pair returned by the last finite batch

    def _pair(self, epsilon: float) -> tuple[float, float]:
        return epsilon, paired_epsilon_high(epsilon, self.epsilon_low, self.epsilon_high)

    def epsilons(self, batch_mean: float) -> tuple[float, float]:
        """(ε_low, ε_high) for this step, from the previous window; then `batch_mean` joins it.

        Disabled: the configured epsilons. A NaN (or infinite) batch mean (nothing scorable: every advantage is 0)
        leaves the window as it is and repeats the last pair (the base pair before any).
        """
        if not self.cfg.enabled:
            return self.epsilon_low, self.epsilon_high
        if batch_mean is None or not math.isfinite(batch_mean):
            return self.last if self.last is not None else self._pair(self.cfg.base)
        previous = list(self.window)
        epsilon = self.cfg.base
        if len(previous) >= 2:
            std = nanstd(previous)  # unbiased, as the advantage's
            if std * std >= MIN_VARIANCE:  # a flat window says nothing about the trend: factor 1
                epsilon = self.cfg.base * (1 + self.cfg.alpha * (batch_mean - nanmean(previous)) / std)
            epsilon = min(max(epsilon, self.cfg.min), self.cfg.max)
        self.window.append(float(batch_mean))
        self.last = self._pair(epsilon)
        return self.last

    def state_dict(self) -> dict[str, Any]:
        """Plain Python (JSON-safe): the window of previous means and the last pair."""
        return {"window": list(self.window), "last": None if self.last is None else list(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run with a shorter `window` keeps the newest means."""
        self.window = deque((float(v) for v in state.get("window", [])), maxlen=self.cfg.window)
        last = state.get("last")
        self.last = None if last is None else (float(last[0]), float(last[1]))
