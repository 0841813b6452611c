"""Adaptive entropy control (Skywork-OR1, arXiv:2505.22312; TRL's use_adaptive_entropy): the entropy
bonus's coefficient follows the policy's entropy across optimizer steps (docs/architecture.md §3).

c starts at algo.entropy_coef. After each optimizer step, with H that step's mean entropy over its
kept tokens (every micro-batch, every process): c <- min(c + delta, coef_max) if H <= target, else
max(c - delta, coef_min). An optimizer step applies c only while the previous step's H was at or
below the target (0 before any H): a static bonus pushes entropy up at every step, collapsed or
not, and the adaptive one pushes only when it has fallen too far, harder the longer it stays there.
"""

from __future__ import annotations

import math
from typing import Any

from grpo_cli.config.schema import AdaptiveEntropyConfig, AlgoConfig


def entropy_bonus_on(algo: AlgoConfig) -> bool:
    """Whether the loss may carry the entropy bonus (so its gradient passes need the entropies):
    a static coefficient, or the adaptive one, which may be 0 now and not later."""
    return algo.entropy_coef > 0 or algo.adaptive_entropy.enabled


class AdaptiveEntropy:
    """Stateful across steps: the coefficient and the last measured entropy, which a checkpoint
    must keep (a resumed run would otherwise restart at entropy_coef with the bonus off).

    >>> control = AdaptiveEntropy(AdaptiveEntropyConfig(enabled=True, target=1.0, coef_delta=0.01), 0.02)
    >>> control.coefficient()  # no entropy measured yet: off
    0.0
    >>> control.observe(0.5)  # below the target: up one delta, and on from the next step
    >>> round(control.coef, 4), round(control.coefficient(), 4)
    (0.03, 0.03)
    >>> control.observe(2.0)  # above it: down one delta, and off
    >>> round(control.coef, 4), control.coefficient()
    (0.02, 0.0)
    """

    def __init__(self, cfg: AdaptiveEntropyConfig, entropy_coef: float) -> None:
        self.cfg = cfg
        self.coef = float(entropy_coef)  # disabled: the static algo.entropy_coef, for good
        self.last_entropy: float | None = None  # the last optimizer step's kept-token mean entropy

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def coefficient(self) -> float:
        """The coefficient the next optimizer step's loss applies: disabled, algo.entropy_coef."""
        if not self.cfg.enabled:
            return self.coef
        if self.last_entropy is None or self.last_entropy > self.cfg.target:
            return 0.0
        return self.coef

    def observe(self, entropy: float) -> None:
        """One optimizer step's mean entropy over its kept tokens, every process's. A step with no
        kept token (NaN) or a non-finite one leaves the state alone: it measured nothing."""
        if not self.cfg.enabled or not math.isfinite(entropy):
            return
        if entropy <= self.cfg.target:
            self.coef = min(self.coef + self.cfg.coef_delta, self.cfg.coef_max)
        else:
            self.coef = max(self.coef - self.cfg.coef_delta, self.cfg.coef_min)
        self.last_entropy = float(entropy)

    def state_dict(self) -> dict[str, Any]:
        """Plain Python (JSON-safe): the coefficient and the last entropy (None before any)."""
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])
        last = state.get("last_entropy")
        self.last_entropy = None if last is None else float(last)
