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


def weighted_mean(values: dict[str, float], weights: dict[str, float]) -> float:
    """Σ_valid w_i v_i / Σ_valid w_i over the names with a positive weight and a value (not NaN);
    NaN when none has both. The one rule the fused reward and the raw reward are computed by.

    >>> weighted_mean({"a": 1.0, "b": float("nan"), "c": 0.0}, {"a": 1.0, "b": 5.0, "c": 0.25})
    0.8
    """
    valid = [(weights[name], v) for name, v in values.items() if weights.get(name, 0.0) > 0 and not math.isnan(v)]
    total = sum(w for w, _ in valid)
    return sum(w * v for w, v in valid) / total if valid else math.nan


SCALES = ("group", "batch", "none")  # algo.scale_rewards: what a group's centred values are divided by


def constant_groups(values: list[float], group_size: int) -> list[bool]:
    """Per group: fewer than two valid (non-NaN) values, or all of them equal. Such a group has no
    signal: its z-scores and advantages are exactly 0, and dynamic sampling drops it.

    >>> constant_groups([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")], 2)
    [True, False, True, True]
    """
    out = []
    for start in range(0, len(values), group_size):
        group = finite(values[start : start + group_size])
        out.append(len(group) < 2 or max(group) == min(group))
    return out


def group_zscores(values: list[float], group_size: int, scale: str = "group") -> list[float]:
    """(x − mean_g)/(s + 1e-4) over each group's valid values (NaN stays NaN), s the group's
    unbiased std (`group`), the whole batch's (`batch`), or no division at all (`none`, Dr. GRPO).
    A group whose valid values are all equal, or has just one, gives exactly 0: its mean need not
    equal its values in floating point (0.1 + 0.1 + 0.1 ≠ 0.3), and a z-score of 1e-13 would make a
    group without a signal look like one. The group advantage and the group_zscore normalisation
    are both this function.

    >>> group_zscores([1.0, 2.0, 3.0, 5.0, 5.0, float("nan")], 3)[:2]
    [-0.9999000099990001, 0.0]
    >>> group_zscores([1.0, 2.0, 3.0, 5.0, 5.0, float("nan")], 3)[3:]
    [0.0, 0.0, nan]
    >>> group_zscores([0.1, 0.1, 0.1], 3)
    [0.0, 0.0, 0.0]
    """
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: one of {', '.join(SCALES)}")
    if group_size < 1 or len(values) % group_size:
        raise ValueError(f"{len(values)} values do not split into groups of {group_size}")
    batch_std = nanstd(values)
    out = [math.nan] * len(values)
    for start, constant in zip(range(0, len(values), group_size), constant_groups(values, group_size), strict=True):
        idx = [i for i in range(start, start + group_size) if not math.isnan(values[i])]
        group = [values[i] for i in idx]
        if constant:
            for i in idx:
                out[i] = 0.0
            continue
        mean = sum(group) / len(group)
        divisor = {"group": nanstd(group) + STD_EPS, "batch": batch_std + STD_EPS, "none": 1.0}[scale]
        for i in idx:
            out[i] = (values[i] - mean) / divisor
    return out


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
