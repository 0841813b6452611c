"""Fuse per-function scores into one reward per completion (docs/architecture.md §3, seed 000).

Per function: normalise (`none`, `zscore`, `sigmoid`, `group_zscore`), NaN staying NaN. Then
either `weighted_mean` (R = Σ_valid w_i r̂_i / Σ_valid w_i) or `normalize_then_sum` (group
z-scores, then Σ_valid w_i z_i, GDPO-style). A sample no function scored stays NaN (unscorable).
A function that fails `max_consecutive_failures` batches in a row is masked and its fallback
takes its weight. The weight effect says how much of the fused reward's variance each drives.

Rows a multi-turn rollout's environment failed (`BatchScores.env_failed`) are the environment's: NaN,
never counted against a function; an environment that fails every row of `max_consecutive_failures`
batches in a row stops the run (`EnvironmentDown`). Calling the functions is `rewards.scoring`'s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.config.schema import NORMALIZATIONS, ON_ROW_ERROR, RewardConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards.executor import BatchScores
from grpo_cli.rewards.sources import RewardSource
from grpo_cli.stats import STD_EPS, EmaMoments, finite, group_zscores, nanmean, weight_effect, weighted_mean

AGGREGATIONS = ("weighted_mean", "normalize_then_sum")

log = logging.getLogger(__name__)


class NoRewardLeft(GrpoError):
    """Every reward function is masked: nothing can score a completion, so a step would train on
    nothing (every advantage 0) and the run would end 'successfully' having learnt nothing."""


class EnvironmentDown(NoRewardLeft):
    """The environment failed every row of `reward.max_consecutive_failures` batches in a row: no
    completion can be scored (a failed row is out of the step), so the run stops as when every
    function is masked, saying it is the environment's failure, not the reward functions'."""


@dataclass
class FusionResult:
    fused: list[float]  # NaN: unscorable
    # Each completion's raw reward: the weighted mean of its functions' raw values under the configured
    # weights (masking's fallbacks applied, the curriculum's not), NaN where no function scored it. Progress
    # in the rewards' own units for the adaptive clip, the guard, the hacking alert and the sweep objective:
    # the fused reward's mean is near 0 under zscore, and the curriculum's weights would move it at every
    # phase change with no change in the policy.
    raw: list[float]
    per_function: dict[str, list[float]]  # raw values (a raised row's floor under on_row_error=zero), NaN: none
    normalized: dict[str, list[float]]  # what the aggregation combines: r̂, or group z under normalize_then_sum
    nan_indices: dict[str, list[int]]
    errors: dict[str, str | None]  # this batch's error; for a masked function the one that masked it
    unscorable_indices: list[int]
    masked: list[str]
    alerts: list[str]  # this batch's masking alerts, completions a function raised on, rows missing a column
    effective_weights: dict[str, float]  # after masking and fallbacks
    weight_effect: dict[str, float]  # share of Var(R) each function drives; sums to 1
    contributions: dict[str, list[float]]  # x_i per sample: Σ_i x_i = R (0 where i did not score)
    # what TRL-style functions logged: "<function>/<name>" -> the mean of log_metric's values this batch, and
    # log_extra's "<function>/<column>" -> one value per completion (None where a part logged none)
    logged: dict[str, float] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)
    env_failed: list[int] = field(default_factory=list)  # rows the environment failed: NaN, not a function's doing


def sigmoid(x: float) -> float:
    """1/(1+e^−x), written so neither branch overflows.

    >>> sigmoid(0.0), round(sigmoid(math.log(3)), 6), sigmoid(-1000.0)
    (0.5, 0.75, 0.0)
    """
    if math.isnan(x):
        return math.nan
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _first_error(scores: BatchScores) -> str | None:
    """The batch's error, else the first error of a completion the function raised on, else the
    first value it returned that was not a number."""
    return scores.error or next(iter(scores.row_errors.values()), None) or scores.non_numeric


def _batch_length(scores: dict[str, BatchScores], group_size: int) -> int:
    lengths = {len(b.values) for b in scores.values()}
    if len(lengths) != 1:
        raise ValueError(f"reward scores need one common batch length, got {sorted(lengths)}")
    n = lengths.pop()
    if group_size < 1 or n % group_size:
        raise ValueError(f"batch of {n} is not a whole number of groups of {group_size}")
    return n


class RewardFusion:
    """Stateful across batches: zscore running stats, failure counts, masked functions."""

    def __init__(
        self,
        sources: list[RewardSource],
        max_consecutive_failures: int = 3,
        aggregation: str = "weighted_mean",
        ema_momentum: float = 0.9,
    ) -> None:
        if aggregation not in AGGREGATIONS:
            raise GrpoError(f"reward.aggregation '{aggregation}' is not one of {', '.join(AGGREGATIONS)}")
        if max_consecutive_failures < 1:
            raise GrpoError("reward.max_consecutive_failures must be at least 1")
        if not 0 <= ema_momentum < 1:
            raise GrpoError(f"reward.ema_momentum {ema_momentum} must be in [0, 1)")
        for s in sources:
            if s.normalize not in NORMALIZATIONS:
                raise GrpoError(f"reward '{s.name}': normalize '{s.normalize}' is not one of {NORMALIZATIONS}")
            if s.on_row_error not in ON_ROW_ERROR:
                raise GrpoError(f"reward '{s.name}': on_row_error '{s.on_row_error}' is not one of {ON_ROW_ERROR}")
            if s.ema_momentum is not None and not 0 <= s.ema_momentum < 1:
                raise GrpoError(f"reward '{s.name}': ema_momentum {s.ema_momentum} must be in [0, 1)")
        self.sources = list(sources)
        self.max_consecutive_failures = max_consecutive_failures
        self.aggregation = aggregation
        self.ema_momentum = ema_momentum
        self._by_name = {s.name: s for s in self.sources}
        self._stats = {s.name: EmaMoments() for s in self.sources if s.normalize == "zscore"}
        self._failures = {s.name: 0 for s in self.sources}
        self._last_error: dict[str, str | None] = {s.name: None for s in self.sources}
        self.masked: list[str] = []  # in the order they were masked
        self._env_failures = 0  # batches in a row whose every row the environment failed
        self._env_error: str | None = None  # the last of them's first env_error

    @classmethod
    def from_config(cls, sources: list[RewardSource], reward: RewardConfig) -> RewardFusion:
        """The fusion `reward.*` asks for: train, score and eval build it the same way."""
        return cls(sources, reward.max_consecutive_failures, reward.aggregation, reward.ema_momentum)

    # ---- weights -----------------------------------------------------------------------
    def _fallback_target(self, name: str) -> str | None:
        """Follow fallbacks past masked functions to one still active (None if the chain ends)."""
        seen = {name}
        target = self._by_name[name].fallback
        while target is not None and target in self.masked and target not in seen:
            seen.add(target)
            target = self._by_name[target].fallback
        return None if target is None or target in self.masked else target

    def effective_weights(self, weights: dict[str, float] | None = None) -> dict[str, float]:
        """Configured (or curriculum) weights with masked functions' weight moved to their fallback."""
        unknown = sorted(set(weights or {}) - set(self._by_name))
        if unknown:
            raise GrpoError(f"weights given for unknown reward function(s) {unknown}")
        base = {s.name: float((weights or {}).get(s.name, s.weight)) for s in self.sources}
        effective = {name: 0.0 if name in self.masked else w for name, w in base.items()}
        for name in self.masked:
            target = self._fallback_target(name)
            if target is not None:
                effective[target] += base[name]
        return effective

    # ---- failures ----------------------------------------------------------------------
    def _record(self, name: str, batch: BatchScores) -> str | None:
        """Count a failed batch (raised, or nothing valid); return an alert if this one masks it."""
        judged = batch.judged()  # rows missing a column it needs are the data's gap, not its failure
        if not judged and batch.error is None:
            return None  # nothing to judge (every row the environment's or the data's gap): no evidence either way
        failed = batch.error is not None or not finite(judged)
        if not failed:
            self._failures[name] = 0
            return None
        self._failures[name] += 1
        self._last_error[name] = batch.error or batch.non_numeric or "every value was None or NaN"
        if self._failures[name] < self.max_consecutive_failures:
            return None
        self.masked.append(name)
        target = self._fallback_target(name)
        takeover = f"fallback '{target}' takes over its weight" if target else "no fallback: its weight is dropped"
        return (
            f"reward '{name}' masked after {self._failures[name]} consecutive failed batches "
            f"(last error: {self._last_error[name]}); {takeover}"
        )

    # ---- normalisation -----------------------------------------------------------------
    def momentum(self, source: RewardSource) -> float:
        """The source's own EMA momentum, else the fusion's (reward.ema_momentum)."""
        return source.ema_momentum if source.ema_momentum is not None else self.ema_momentum

    def _normalize(
        self, source: RewardSource, values: list[float], group_size: int, update: bool, grouped: bool
    ) -> list[float]:
        kind = source.normalize
        if kind == "none" or (kind == "group_zscore" and not grouped):
            return list(values)
        if kind == "sigmoid":
            return [sigmoid(v) for v in values]
        if kind == "group_zscore":
            return group_zscores(values, group_size)
        # zscore: the stats include this batch (updated first), so the first batch is centred
        # on itself instead of on nothing, and a shift shows up at once, damped by the momentum.
        stats = self._stats[source.name]
        valid = finite(values)
        if valid and (update or not stats.seeded):
            if not update:  # a read-only call on a fresh source: this batch's own stats, unstored
                stats = EmaMoments()
            stats.update(valid, self.momentum(source))
        if not stats.seeded:
            return list(values)  # all NaN and nothing seen yet
        std = math.sqrt(stats.var)
        return [(v - stats.mean) / (std + STD_EPS) for v in values]

    # ---- the fusion --------------------------------------------------------------------
    def fuse(
        self,
        scores: dict[str, BatchScores],
        group_size: int,
        weights: dict[str, float] | None = None,
        update_state: bool = True,
        grouped: bool = True,
    ) -> FusionResult:
        """`scores` by source name (a masked source may be left out). `update_state=False` (e.g. for
        evaluation) leaves running stats, failure counts and masks untouched.

        `grouped=False` is for completions that are not a group of rivals (evaluation's one greedy
        answer per prompt): a z-score within a group of one is always 0, so `group_zscore` functions
        keep their raw values and `normalize_then_sum` becomes the weighted mean; `zscore` still
        uses the running statistics of training.
        """
        n = _batch_length(scores, group_size)
        batches = {s.name: scores.get(s.name, BatchScores([math.nan] * n, "not scored")) for s in self.sources}
        env_failed = {row: why for b in scores.values() for row, why in b.env_failed.items()}
        if update_state:
            self._record_environment(env_failed, n)
        alerts = self._record_failures(batches) if update_state else []
        alerts += self._row_alerts(batches, n)
        effective = self.effective_weights(weights)
        per_function = {s.name: self._raw_values(s, batches[s.name]) for s in self.sources}
        summed = grouped and self.aggregation == "normalize_then_sum"
        normalized = {
            s.name: self._fusion_input(s, per_function[s.name], group_size, update_state, grouped, summed)
            for s in self.sources
        }
        fused, contributions = self._combine(normalized, effective, summed, n)
        errors = {
            s.name: self._last_error[s.name] if s.name in self.masked else _first_error(batches[s.name])
            for s in self.sources
        }
        return FusionResult(
            fused=fused,
            raw=self.raw_rewards(per_function, effective),
            per_function=per_function,
            normalized=normalized,
            nan_indices={name: [j for j, v in enumerate(vals) if math.isnan(v)] for name, vals in per_function.items()},
            errors=errors,
            unscorable_indices=[j for j, r in enumerate(fused) if math.isnan(r)],
            masked=list(self.masked),
            alerts=alerts,
            effective_weights=effective,
            weight_effect=weight_effect(fused, contributions, effective),
            contributions=contributions,
            logged={f"{s.name}/{k}": nanmean(v) for s in self.sources for k, v in batches[s.name].logged.items()},
            extra={f"{s.name}/{k}": v for s in self.sources for k, v in batches[s.name].extra.items()},
            env_failed=sorted(env_failed),
        )

    def _record_environment(self, env_failed: dict[int, str], n: int) -> None:
        """Count a batch whose every row the environment failed; stop the run (EnvironmentDown) at
        `max_consecutive_failures` of them in a row, as when every function is masked: nothing can
        be scored. A batch with any row left resets the count (the run goes on, the step's
        environment alert names the failed rows)."""
        if not env_failed or len(env_failed) < n:
            self._env_failures = 0
            return
        self._env_failures += 1
        self._env_error = env_failed[min(env_failed)]
        if self._env_failures >= self.max_consecutive_failures:
            raise EnvironmentDown(
                f"the environment failed every row of reward.max_consecutive_failures={self.max_consecutive_failures} "
                f"batches in a row (last: {self._env_error}): nothing is left to score completions, and the "
                "reward functions were never at fault"
            )

    def _record_failures(self, batches: dict[str, BatchScores]) -> list[str]:
        """Count each active function's failed batch; the masking alerts. Refuses to go on once
        every function is masked (NoRewardLeft)."""
        alerts = []
        for name, batch in batches.items():
            if name not in self.masked and (alert := self._record(name, batch)):
                log.warning(alert)
                alerts.append(alert)
        if self.sources and len(self.masked) == len(self.sources):
            last = "; ".join(f"{name}: {self._last_error[name]}" for name in self.masked)
            raise NoRewardLeft(
                f"every reward function is masked after failing reward.max_consecutive_failures="
                f"{self.max_consecutive_failures} batches in a row ({last}): nothing is left to score completions"
            )
        return alerts

    def _row_alerts(self, batches: dict[str, BatchScores], n: int) -> list[str]:
        """Rows an active function did not judge (a missing column) or raised on (`score_each`)."""
        alerts = []
        for name, scored in batches.items():
            if name in self.masked:
                continue
            for column, rows in scored.missing.items():
                alerts.append(
                    f"reward '{name}': {len(rows)} of {n} completions have no '{column}' in their data row "
                    "(missing or null): NaN for them"
                )
            if scored.row_errors:
                row, error = next(iter(scored.row_errors.items()))
                outcome = (
                    "scored 0 for them (on_row_error=zero)"
                    if self._by_name[name].on_row_error == "zero"
                    else "NaN for them, judged by the other functions (on_row_error=skip)"
                )
                alerts.append(
                    f"reward '{name}' raised on {len(scored.row_errors)} of {n} completions: {outcome}; "
                    f"the rest of its batch stands (row {row}: {error})"
                )
        return alerts

    def _raw_values(self, source: RewardSource, batch: BatchScores) -> list[float]:
        """The function's raw values for the fusion: NaN throughout once masked; a row it raised on
        scores its floor, 0, under `on_row_error=zero` (the default). The completion decides whether
        a scorer raises, so a NaN there would judge it on the other functions alone, and an answer
        that breaks the strict scorer could tie the right one; a None the function returns on
        purpose stays NaN (not judged)."""
        if source.name in self.masked:
            return [math.nan] * len(batch.values)
        values = list(batch.values)
        if source.on_row_error == "zero":
            for row in batch.row_errors:
                values[row] = 0.0
        return values

    def _fusion_input(
        self, source: RewardSource, raw: list[float], group_size: int, update: bool, grouped: bool, summed: bool
    ) -> list[float]:
        """What the aggregation combines: r̂, then the group z-score of r̂ under normalize_then_sum."""
        if source.name in self.masked:
            return raw
        r_hat = self._normalize(source, raw, group_size, update, grouped)
        return group_zscores(r_hat, group_size) if summed and source.normalize != "group_zscore" else r_hat

    def _combine(
        self, normalized: dict[str, list[float]], effective: dict[str, float], summed: bool, n: int
    ) -> tuple[list[float], dict[str, list[float]]]:
        """R_j = Σ_valid w_i r̂_i / Σ_valid w_i (weighted_mean) or Σ_valid w_i z_i (normalize_then_sum),
        and each function's term x_i of it (Σ_i x_i = R_j; 0 where it did not score)."""
        fused, contributions = [], {name: [0.0] * n for name in normalized}
        for j in range(n):
            row = {name: values[j] for name, values in normalized.items()}
            valid = {name: v for name, v in row.items() if effective[name] > 0 and not math.isnan(v)}
            scale = 1.0 if summed or not valid else sum(effective[name] for name in valid)
            for name, v in valid.items():
                contributions[name][j] = effective[name] * v / scale
            if summed:
                fused.append(sum(effective[name] * v for name, v in valid.items()) if valid else math.nan)
            else:  # the one weighted mean the raw reward is computed by too
                fused.append(weighted_mean(row, effective))
        return fused, contributions

    def raw_rewards(self, per_function: dict[str, list[float]], effective: dict[str, float]) -> list[float]:
        """FusionResult.raw: per completion, stats.weighted_mean of the raw values under the configured
        weights with masked functions' weight on their fallbacks; the step's (curriculum's) weights only
        where every configured weight is 0 (a curriculum that brings every function in itself)."""
        fixed = self.effective_weights(None)
        if not any(w > 0 for w in fixed.values()):
            fixed = effective
        n = len(next(iter(per_function.values()), []))
        return [weighted_mean({name: values[j] for name, values in per_function.items()}, fixed) for j in range(n)]

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python (JSON-safe): running stats, failure counts, last errors, masked names."""
        return {
            "stats": {name: {"mean": s.mean, "var": s.var, "seeded": s.seeded} for name, s in self._stats.items()},
            "failures": dict(self._failures),
            "last_error": dict(self._last_error),
            "masked": list(self.masked),
            "env_failures": self._env_failures,
            "env_error": self._env_error,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Names no longer configured are ignored: a resumed run may have changed its rewards."""
        for name, s in state.get("stats", {}).items():
            if name in self._stats:
                self._stats[name] = EmaMoments(float(s["mean"]), float(s["var"]), bool(s["seeded"]))
        for name, count in state.get("failures", {}).items():
            if name in self._failures:
                self._failures[name] = int(count)
        for name, error in state.get("last_error", {}).items():
            if name in self._last_error:
                self._last_error[name] = error
        self.masked = [name for name in state.get("masked", []) if name in self._by_name]
        self._env_failures = int(state.get("env_failures", 0))  # a checkpoint from before it counted: 0
        self._env_error = state.get("env_error")
