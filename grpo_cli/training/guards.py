"""Stability guards (docs/architecture.md §3, seed 001): notice a run going unstable and warn, pause or stop.

Two signals, both read after a step's update:
- the batch raw reward's (rewards.FusionResult.raw: a normalised fused reward's mean is near 0
  by construction) coefficient of variation, std / |mean|, above `guard.reward_cv_threshold` for
  `guard.patience` batches in a row. Where |mean| < `guard.min_abs_mean` the CV is undefined (a
  sparse reward early in a run sits near 0): such a batch neither extends nor resets the streak.
  One verdict per episode: the streak reaching `patience` opens an episode and acts once; the
  episode lasts until a batch's CV is back at or under the threshold, so a noisy stretch of 40
  steps is one alert, not one every `patience` steps (issue 21: 46 in the default run's 300).
- steps whose every optimizer update was non-finite (skipped): after `guard.max_skipped_steps` in a
  row the run stops. Skipped updates never moved the weights, so the checkpoint written on the way
  out holds the last good weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_cli.config.schema import GuardConfig
from grpo_cli.stats import nanmean, nanstd

EXIT_PAUSED = 75  # EX_TEMPFAIL: try again later (resume); distinct from a crash (1) and Ctrl-C (130)
EXIT_STOPPED = 76  # the guard ended the run; a checkpoint of the last good state is on disk


@dataclass
class GuardVerdict:
    action: str  # warn | pause | stop
    reason: str


class StabilityGuard:
    """`observe()` once per step; its streak counters are part of TrainState, so a resumed run
    counts on from where it stopped."""

    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self.cv_streak = 0
        self.cv_episode = False  # the streak has reached patience and acted; no verdict until a stable batch
        self.skipped_streak = 0

    def reward_cv(self, rewards: list[float]) -> float | None:
        """std / |mean| of the batch's scorable rewards; None where |mean| is too small to divide by.

        >>> StabilityGuard(GuardConfig()).reward_cv([1.0, 3.0])
        0.7071067811865476
        >>> StabilityGuard(GuardConfig()).reward_cv([-0.0001, 0.0001]) is None
        True
        """
        mean = nanmean(rewards)
        if math.isnan(mean) or abs(mean) < self.cfg.min_abs_mean:
            return None
        return nanstd(rewards) / abs(mean)

    def observe(self, rewards: list[float], applied_updates: int, skipped_updates: int) -> list[GuardVerdict]:
        """Update the streaks with this step; the verdicts it triggers: at most one per episode of
        unstable batches, so a resumed run is not paused again by the episode that paused it."""
        verdicts = []
        if applied_updates == 0 and skipped_updates > 0:
            self.skipped_streak += 1
            if self.skipped_streak >= self.cfg.max_skipped_steps:
                verdicts.append(
                    GuardVerdict(
                        "stop",
                        f"{self.skipped_streak} steps in a row had only non-finite losses or gradients "
                        f"(guard.max_skipped_steps={self.cfg.max_skipped_steps}); the weights are the last good ones",
                    )
                )
        else:
            self.skipped_streak = 0
        cv = self.reward_cv(rewards)
        if cv is not None:
            unstable = cv > self.cfg.reward_cv_threshold
            self.cv_streak = self.cv_streak + 1 if unstable else 0
            self.cv_episode = self.cv_episode and unstable  # a stable batch ends the episode
            if self.cv_streak >= self.cfg.patience and not self.cv_episode:
                self.cv_episode = True
                verdicts.append(
                    GuardVerdict(
                        self.cfg.action,
                        f"reward CV (std/|mean|) above {self.cfg.reward_cv_threshold} for {self.cv_streak} batches "
                        f"in a row (now {cv:.3g}; guard.reward_cv_threshold, guard.patience); no further alert "
                        "until a batch is back under the threshold",
                    )
                )
        return verdicts

    def metrics(self, rewards: list[float]) -> dict[str, float | None]:
        return {"guard/reward_cv": self.reward_cv(rewards), "guard/cv_streak": self.cv_streak}

    def state_dict(self) -> dict[str, Any]:
        return {"cv_streak": self.cv_streak, "cv_episode": self.cv_episode, "skipped_streak": self.skipped_streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cv_streak, self.skipped_streak = int(state["cv_streak"]), int(state["skipped_streak"])
        self.cv_episode = bool(state.get("cv_episode", False))  # a checkpoint from before episodes has none open


class TrainingHalted(Exception):
    """A guard paused or stopped the run after the step was finished and saved."""

    def __init__(self, verdict: GuardVerdict, step: int, checkpoint: str) -> None:
        super().__init__(verdict.reason)
        self.verdict, self.step, self.checkpoint = verdict, step, checkpoint

    @property
    def exit_code(self) -> int:
        return EXIT_PAUSED if self.verdict.action == "pause" else EXIT_STOPPED
