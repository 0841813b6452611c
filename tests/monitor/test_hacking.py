"""The reward-hacking alert on the run that showed the need for it: the tiny default under
`reward=code curriculum=three_phase` learns to answer `####` (a comment compiles and has perfect
style) while code_tests, the success function, never moves (issue 25)."""

from __future__ import annotations

import pytest

from grpo_cli.training import GRPOTrainer
from tests.training.test_curriculum import composed

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
