"""The warnings a step raises beside its figures, gathered in one place: reward failures, guard
verdicts, NaN rates, repetition, reward hacking and a sampling engine that drifted from the policy.
They only watch; the guard's pause or stop is the trainer's to carry out."""

from __future__ import annotations

from typing import Any

from grpo_cli.config.schema import MonitorConfig
from grpo_cli.monitor.diversity import RepetitionAlert
from grpo_cli.monitor.hacking import HackingAlert
from grpo_cli.rewards import FusionResult
from grpo_cli.training.guards import GuardVerdict
from grpo_cli.training.metrics import nan_rate_alerts
from grpo_cli.training.state import TrainState


class StepAlerts:
    """One call per step; the episode-long alerts keep their state in TrainState (a resume re-fires nothing)."""

    def __init__(
        self, monitor: MonitorConfig, success_name: str, state: TrainState, sampling_copy: bool = False
    ) -> None:
        self.nan_alert, self.success_name = monitor.nan_alert, success_name
        self.sampling_copy = sampling_copy  # rollout.sampling_weights took a bf16 copy: its own threshold
        self.engine_gap_alert = monitor.copy_gap_alert if sampling_copy else monitor.engine_gap_alert
        self.repetition = RepetitionAlert(monitor.repetition_alert)
        self.serial = SerialPipelineAlert()
        self.hacking = HackingAlert(success_name, monitor.hacking_alert, monitor.hacking_window)
        state.register("repetition", self.repetition)
        state.register("hacking", self.hacking)

    def observe(self, fusion: FusionResult, verdicts: list[GuardVerdict], metrics: dict[str, Any]) -> list[str]:
        alerts = [*fusion.alerts, *(f"guard ({v.action}): {v.reason}" for v in verdicts)]
        alerts += nan_rate_alerts(fusion, self.nan_alert)
        if repetition := self.repetition.observe(metrics["repetition/rate"]):
            alerts.append(repetition)
        if hacking := self.hacking.observe(metrics["reward/raw_mean"], metrics[f"reward/{self.success_name}/mean"]):
            alerts.append(hacking)
        # rollout.max_staleness: a stale batch's gap is the policy's own movement since, not the engine's numerics
        gap = metrics.get("rollout/engine_gap") if metrics.get("async/staleness", 0.0) == 0 else None
        if gap := engine_gap_alert(gap, self.engine_gap_alert, self.sampling_copy):
            alerts.append(gap)
        if "async/overlap" in metrics and (serial := self.serial.observe(metrics)):
            alerts.append(serial)
        return alerts


class SerialPipelineAlert:
    """rollout.max_staleness >= 1 that runs one side after the other (the two threads taking turns on
    one core or the GIL, an engine that blocks the trainer): over the last WINDOW steps, the sampler
    sampled during under MIN_OVERLAP of the learner's work, although it was not short of work (idle
    under half the time). The pipeline then costs staleness and buys no time."""

    WINDOW = 5
    MIN_OVERLAP = 0.1

    def __init__(self) -> None:
        self.recent: list[tuple[float, float]] = []  # (async/overlap, async/sampler_idle) of the last steps

    def observe(self, metrics: dict[str, Any]) -> str | None:
        self.recent = [*self.recent, (metrics["async/overlap"], metrics["async/sampler_idle"])][-self.WINDOW :]
        overlap = sum(o for o, _ in self.recent) / len(self.recent)
        idle = sum(i for _, i in self.recent) / len(self.recent)
        if len(self.recent) < self.WINDOW or overlap >= self.MIN_OVERLAP or idle >= 0.5:
            return None
        return (
            f"rollout.max_staleness: the sampler sampled during {overlap:.0%} of the learner's work over the last "
            f"{self.WINDOW} steps (async/overlap) while busy {1 - idle:.0%} of the time: sampling and training run "
            "one after the other, so staleness buys no time; give each side cores of its own (train.threads, "
            "taskset) or set rollout.max_staleness=0"
        )


def engine_gap_alert(gap: float | None, threshold: float, sampling_copy: bool = False) -> str | None:
    """The alert for a `rollout/engine_gap` past `monitor.engine_gap_alert` (vLLM) or
    `monitor.copy_gap_alert` (the bf16 copy): the run is more off-policy than its engine's numerics
    explain (the engine holds other weights than the policy)."""
    if gap is None or threshold <= 0 or gap <= threshold:
        return None
    if sampling_copy:
        return (
            f"rollout/engine_gap={gap:.3g} > monitor.copy_gap_alert={threshold:g}: the bf16 copy the rollouts "
            "sample from is further from the policy than bf16 rounding explains; algo.rollout_correction weighs "
            "for it; rollout.sampling_weights=policy samples the fp32 policy itself"
        )
    return (
        f"rollout/engine_gap={gap:.3g} > monitor.engine_gap_alert={threshold:g}: the vLLM engine samples from "
        "another policy than the one being trained (a weight push that did not reach it, or a lower engine "
        "precision: rollout.vllm.dtype); algo.rollout_correction weighs for it, but check the push"
    )
