"""An alert for the reward rising without the task: the raw reward climbs while the success
function (eval.success, by default the first of reward.functions) stays where it started.

That is what reward hacking looks like from the metrics alone: a tiny model under `reward=code
curriculum=three_phase` learns to answer `####` (a comment: it compiles and its style is perfect),
so the reward goes from 0.01 to 0.59 while code_tests never leaves 0.01. Each term is working as
written; only the comparison with the function that says "solved" shows the policy found a way
around the task.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from grpo_cli.stats import nanmean

# The success function must rise by at least this share of the reward's rise. The default run (exact
# match + partial credit on additions) moves exact_match by 0.02-0.04 while its reward rises by 0.2:
# shaping that works, and no alert; the `####` run moves code_tests by 0.000.
SUCCESS_SHARE = 0.1


class HackingAlert:
    """Compares the mean of the latest `window` steps with that of the run's first `window` steps,
    for the raw reward (reward/raw_mean) and for the success function's mean. It fires when the raw
    reward has risen by `threshold` or more while the success function rose by less than a tenth of
    that. After an alert the next one needs the reward to climb another `threshold` (a plateau of
    hacking is said once, not every step). Its windows are part of the TrainState, so a resumed run
    alerts as the original would.

    >>> alert = HackingAlert("code_tests", threshold=0.2, window=2)
    >>> [alert.observe(reward, tests) for reward, tests in [(0.0, 0.0), (0.02, 0.0), (0.1, 0.0)]]
    [None, None, None]
    >>> print(alert.observe(0.5, 0.01))  # doctest: +NORMALIZE_WHITESPACE
    reward/raw_mean rose from 0.010 to 0.300 over the first and the latest 2 steps while code_tests,
    the success function, went from 0.000 to 0.005: the policy may be gaming the other reward terms
    (reward hacking); read the completions
    >>> alert.observe(0.45, 0.0) is None  # latest mean 0.475: not another `threshold` higher, said once
    True
    >>> alert.observe(0.9, 0.0) is not None  # latest mean 0.675: climbing on, said again
    True
    """

    def __init__(self, success: str, threshold: float, window: int) -> None:
        self.success = success
        self.threshold = threshold
        self.window = window
        self.first: list[tuple[float, float]] = []
        self.latest: deque[tuple[float, float]] = deque(maxlen=window)
        self.alerted_at: float | None = None  # the latest window's reward mean at the last alert

    def observe(self, raw_mean: float, success_mean: float) -> str | None:
        if self.threshold <= 0 or math.isnan(raw_mean) or math.isnan(success_mean):
            return None
        if len(self.first) < self.window:
            self.first.append((raw_mean, success_mean))
        self.latest.append((raw_mean, success_mean))
        if len(self.first) < self.window or len(self.latest) < self.window:
            return None
        reward_from, success_from = (nanmean(column) for column in zip(*self.first))
        reward_to, success_to = (nanmean(column) for column in zip(*self.latest))
        rise = reward_to - reward_from
        hacking = rise >= self.threshold and success_to - success_from < SUCCESS_SHARE * rise
        if not hacking or (self.alerted_at is not None and reward_to - self.alerted_at < self.threshold):
            return None
        self.alerted_at = reward_to
        return (
            f"reward/raw_mean rose from {reward_from:.3f} to {reward_to:.3f} over the first and the latest "
            f"{self.window} steps while {self.success}, the success function, went from {success_from:.3f} to "
            f"{success_to:.3f}: the policy may be gaming the other reward terms (reward hacking); read the completions"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first), "latest": list(self.latest), "alerted_at": self.alerted_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [tuple(pair) for pair in state["first"]]
        self.latest = deque((tuple(pair) for pair in state["latest"]), maxlen=self.window)
        self.alerted_at = state["alerted_at"]
