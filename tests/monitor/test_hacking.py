"""The reward-hacking alert: its rule on hand-made series (a rise the success function shares is
shaping, not hacking; a resumed run alerts as the straight one), and on the run that showed the
need for it: the tiny default under `reward=code curriculum=three_phase` learns to answer `####`
(a comment compiles and has perfect style) while code_tests, the success function, never moves
(issue 25)."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.config.schema import MonitorConfig
from grpo_cli.monitor.hacking import HackingAlert
from grpo_cli.training import GRPOTrainer, TrainState
from grpo_cli.training.alerts import StepAlerts
from tests.training.test_curriculum import composed

# (reward/raw_mean, the success function's mean) per step: the alert's doctest series, alerting at
# step 4 (latest mean 0.3), silent at step 5 (0.475: not another threshold higher), again at step 6
SERIES = [(0.0, 0.0), (0.02, 0.0), (0.1, 0.0), (0.5, 0.01), (0.45, 0.0), (0.9, 0.0)]


def hacking_alert(state: TrainState, threshold: float = 0.2, window: int = 2) -> HackingAlert:
    """The alert as the trainer builds it: from monitor.*, registered in the run's TrainState."""
    monitor = MonitorConfig(hacking_alert=threshold, hacking_window=window)
    return StepAlerts(monitor, "exact_match", state).hacking


def test_a_rise_the_success_function_shares_is_shaping_not_hacking() -> None:
    # window 1: the first step against the latest. The reward rises 0.5 both times; the success
    # function by 0.1 (a fifth of it: the task moves with the reward) or by 0.02 (a twenty-fifth).
    shaping, hacking = hacking_alert(TrainState(), window=1), hacking_alert(TrainState(), window=1)
    assert [shaping.observe(reward, success) for reward, success in [(0.0, 0.0), (0.5, 0.1)]] == [None, None]
    assert hacking.observe(0.0, 0.0) is None
    assert "exact_match, the success function, went from 0.000 to 0.020" in hacking.observe(0.5, 0.02)


def test_a_resumed_run_alerts_as_the_straight_run_would(tmp_path) -> None:
    straight = hacking_alert(TrainState())
    expected = [straight.observe(*point) is not None for point in SERIES]
    assert expected == [False, False, False, True, False, True]
    # stopped after the first alert, at step 4; the TrainState saved and loaded as checkpoints do
    state = TrainState()
    first = hacking_alert(state)
    for point in SERIES[:4]:
        first.observe(*point)
    torch.save(state.state_dict(), tmp_path / "training_state.pt")
    state = TrainState()
    resumed = hacking_alert(state)
    state.load_state_dict(torch.load(tmp_path / "training_state.pt", weights_only=False))
    assert [resumed.observe(*point) is not None for point in SERIES[4:]] == expected[4:]


MAX_STEPS = 35  # the full-size run alerts at step 44 of 300 with the default 20-step windows; this one at 19


@pytest.mark.slow
def test_the_tiny_hash_run_raises_the_hacking_alert_naming_the_success_function(tmp_path) -> None:
    cfg = composed(
        "reward=code",
        "curriculum=three_phase",
        "train.steps=300",  # phase 1 (compiles 0.7, style 0.1, tests 0.2) lasts the steps below
        "optim.lr=6e-3",  # three times the default's: the same hack, found in fewer steps
        "monitor.hacking_window=5",  # the rule of the default run on shorter windows, to fit a test
        "monitor.hacking_alert=0.1",
        "sandbox.workers=1",
    )
    trainer = GRPOTrainer(cfg, tmp_path, observers=[])
    trainer.setup()
    alerts, tests_passed = [], []
    try:
        for _ in range(MAX_STEPS):
            result = trainer.step()
            tests_passed.append(result.metrics["reward/code_tests/mean"])
            alerts = [a for a in result.alerts if "reward hacking" in a]
            if alerts:  # at step 19 here
                break
    finally:
        trainer.cleanup()
    assert alerts, f"no hacking alert in {len(tests_passed)} steps"
    assert "while code_tests, the success function," in alerts[0]
    assert max(tests_passed) < 0.05  # what the alert says: the task itself hardly moved
    compiles = result.metrics["reward/code_compiles/mean"]
    assert compiles > 0.2, compiles  # what moved instead
