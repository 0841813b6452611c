"""The statistics every stage shares: NaN-aware moments, the std epsilon, EMA and Welford
moments, and the weight-effect shares (docs/architecture.md §3).

Plain Python on lists of floats, no torch: rewards, scoring and the trainer all import it, and a
figure computed in two places must be computed by the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STD_EPS = 1e-4  # TRL's epsilon: A = (r - mean) / (std + 1e-4); also bounds z-scores of near-constant values
MIN_VARIANCE = 1e-12  # below this a quantity is constant and covariance shares say nothing


def finite(values: list[float]) -> list[float]:
    """The values that are numbers (NaN marks a missing score)."""
    return [v for v in values if v is not None and not math.isnan(v)]


def nanmean(values: list[float]) -> float:
    """Mean over the non-NaN values; NaN when there are none.

    >>> nanmean([1.0, float("nan"), 3.0]), math.isnan(nanmean([float("nan")]))
    (2.0, True)
    """
    kept = finite(values)
    return sum(kept) / len(kept) if kept else math.nan


def nanstd(values: list[float]) -> float:
    """Unbiased (n−1) std over the non-NaN values, as the advantage uses; 0 with fewer than two.

    >>> nanstd([1.0, 3.0, float("nan")]), nanstd([5.0])
    (1.4142135623730951, 0.0)
    """
    kept = finite(values)
    if len(kept) < 2:
        return 0.0
    mean = sum(kept) / len(kept)
    return math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))


def column_mean(rows: list[dict], key: str) -> float:
    """nanmean of `key` over metric rows that hold a number there (a summary over steps).

    >>> column_mean([{"kl": 0.5}, {"kl": None}, {"kl": 1.5}, {}], "kl")
    1.0
    """
    return nanmean([row[key] for row in rows if isinstance(row.get(key), (int, float))])


def nan_fraction(values: list[float]) -> float:
    """Share of entries that are NaN (a reward function's failure rate on a batch)."""
    return sum(v is None or math.isnan(v) for v in values) / len(values) if values else 0.0


@dataclass
class EmaMoments:
    """EMA mean and variance, seeded by the first batch with any value (reward-model `zscore`).

    The variance is that of the EMA-weighted mixture of batches, so a drifting mean widens it:
    var <- m·var + (1−m)·var_b + m(1−m)(mean − mean_b)².

    >>> s = EmaMoments(); s.update([1.0, 3.0], 0.9); (s.mean, s.var)
    (2.0, 1.0)
    >>> s.update([5.0, 7.0], 0.9); (round(s.mean, 6), round(s.var, 6))
    (2.4, 2.44)
    """

    mean: float = 0.0
    var: float = 0.0
    seeded: bool = False

    def update(self, values: list[float], momentum: float) -> None:
        batch_mean = sum(values) / len(values)
        batch_var = sum((v - batch_mean) ** 2 for v in values) / len(values)
        if not self.seeded:
            self.mean, self.var, self.seeded = batch_mean, batch_var, True
            return
        delta = batch_mean - self.mean
        self.mean = momentum * self.mean + (1 - momentum) * batch_mean
        self.var = momentum * self.var + (1 - momentum) * batch_var + momentum * (1 - momentum) * delta**2


@dataclass
class Welford:
    """Streaming mean and unbiased std over finite values, plus a NaN count: constant memory.

    >>> w = Welford()
    >>> for v in (1.0, float("nan"), 3.0): w.add(v)
    >>> w.as_dict()
    {'mean': 2.0, 'std': 1.4142135623730951, 'count': 2, 'nan_count': 1}
    """

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    nan_count: int = 0

    def add(self, value: float | None) -> None:
        if value is None or math.isnan(value):
            self.nan_count += 1
            return
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def as_dict(self) -> dict[str, float | int | None]:
        std = math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0
        return {"mean": self.mean if self.count else None, "std": std, "count": self.count, "nan_count": self.nan_count}


@dataclass
class WeightEffect:
    """Streaming weight-effect shares c_i = Cov(x_i, R) / Var(R) over scorable samples, x_i function
    i's term of the fused reward R (Σ_i x_i = R, so the shares sum to 1).

    One batch (`weight_effect`) and a whole file (`grpo score`) use the same sums.

    >>> e = WeightEffect()
    >>> for x, y in ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0)): e.add({"a": x, "b": y}, x + y)
    >>> {k: round(v, 6) for k, v in e.shares().items()}
    {'a': 0.5, 'b': 0.5}
    """

    n: int = 0
    sum_r: float = 0.0
    sum_rr: float = 0.0
    sum_x: dict[str, float] = field(default_factory=dict)
    sum_xr: dict[str, float] = field(default_factory=dict)

    def add(self, contributions: dict[str, float], fused: float) -> None:
        self.n += 1
        self.sum_r += fused
        self.sum_rr += fused * fused
        for name, x in contributions.items():
            self.sum_x[name] = self.sum_x.get(name, 0.0) + x
            self.sum_xr[name] = self.sum_xr.get(name, 0.0) + x * fused

    def shares(self) -> dict[str, float]:
        """Empty when fewer than two samples or a constant R: the covariances say nothing then."""
        if self.n < 2:
            return {}
        mean_r = self.sum_r / self.n
        var_r = self.sum_rr / self.n - mean_r**2
        if var_r <= MIN_VARIANCE:
            return {}
        return {
            name: (self.sum_xr[name] / self.n - (self.sum_x[name] / self.n) * mean_r) / var_r for name in self.sum_x
        }


def weight_effect(
    fused: list[float], contributions: dict[str, list[float]], effective: dict[str, float]
) -> dict[str, float]:
    """Weight-effect shares of one batch; with a constant R, the effective weight fractions.

    >>> weight_effect([1.0, 1.0], {"a": [1.0, 1.0], "b": [0.0, 0.0]}, {"a": 3.0, "b": 1.0})
    {'a': 0.75, 'b': 0.25}
    """
    effect = WeightEffect()
    for j, r in enumerate(fused):
        if not math.isnan(r):
            effect.add({name: x[j] for name, x in contributions.items()}, r)
    shares = effect.shares()
    if shares:
        return shares
    total = sum(w for w in effective.values() if w > 0)
    return {name: (w / total if total > 0 and w > 0 else 0.0) for name, w in effective.items()}
