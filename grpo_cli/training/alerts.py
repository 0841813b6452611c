"""The warnings a step raises beside its figures, gathered in one place: reward failures, guard
verdicts, NaN rates, repetition and reward hacking. They only watch; the guard's pause or stop is
the trainer's to carry out."""

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

    def __init__(self, monitor: MonitorConfig, success_name: str, state: TrainState) -> None:
        self.nan_alert, self.success_name = monitor.nan_alert, success_name
        self.repetition = RepetitionAlert(monitor.repetition_alert)
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
        return alerts
