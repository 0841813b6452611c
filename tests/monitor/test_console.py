"""What `grpo train` prints: the step results of a real 3-step run through each console mode, and the
alerts and NaN indices of a reward function that fails on half the batch."""

from __future__ import annotations

import copy
import dataclasses
import io
import logging

import pytest
from rich.console import Console

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.monitor import StepResult, TrainingConsole
from grpo_cli.training import GRPOTrainer
from tests.conftest import Recorder

STEPS = 3


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[StepResult]:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = STEPS, 2, 4
    # scores every other completion, None for the rest: a NaN share of exactly monitor.nan_alert (0.5)
    cfg.reward.functions.append(RewardFunctionConfig(name="half", target="tests.rewards.pool_functions:half_none"))
    collect = Recorder()
    trainer = GRPOTrainer(cfg, tmp_path_factory.mktemp("run"), [collect])
    trainer.setup()
    trainer.train()
    return collect.results


def printed(mode: str, results: list[StepResult], terminal: bool, **kwargs) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=terminal, width=100)
    with TrainingConsole(STEPS, mode, console, **kwargs) as shown:
        for result in results:
            shown.on_step(result)
    return buffer.getvalue()


def test_a_failing_reward_function_raises_an_alert_and_logs_which_completions_failed(results):
    for result in results:
        assert result.metrics["reward/half/nan_indices"] == [1, 3, 5, 7]
        assert result.metrics["reward/half/nan_frac"] == 0.5
        assert any(alert.startswith("reward half returned NaN for 50% of the batch") for alert in result.alerts)
        assert result.rewards["half"][0] == 1.0 and len(result.fused) == 8


def test_auto_prints_plain_lines_without_escape_codes_when_not_a_terminal(results):
    out = printed("auto", results, terminal=False, print_every=2)
    assert "\x1b" not in out  # no cursor movement, no colour: CI logs stay readable
    lines = out.splitlines()
    step_lines = [line for line in lines if line.startswith("step ")]
    # the first step, every print_every-th, and the last: one line each, however wide
    assert [line.split()[1] for line in step_lines] == ["1/3", "2/3", "3/3"]
    assert "reward " in step_lines[0] and "entropy " in step_lines[0] and "distinct2 " in step_lines[0]
    assert sum("alert (step 1): reward half returned NaN" in line for line in lines) == 1


def test_rich_shows_a_live_panel_with_the_latest_figures_and_alerts(results):
    out = printed("rich", results, terminal=True)
    assert "\x1b[" in out  # a live display redraws in place
    assert "3/3" in out and "partial_credit" in out and "tok/s" in out
    assert "half 50%" in out  # the panel names the function returning NaN
    assert printed("auto", results, terminal=True).count("3/3") >= 1


def test_quiet_prints_alerts_only(results):
    out = printed("quiet", results, terminal=False, completions_every=1, completions_to_print=2)
    assert not [line for line in out.splitlines() if line.startswith("step ")]
    assert out.count("alert (step 1)") == len(results[0].alerts) > 0
    assert "alert repeated 3 times, steps 1-3" in out  # the same NaN alert on steps 2 and 3: counted


def test_an_alert_repeating_every_step_is_said_a_few_times_and_summarised_while_the_log_keeps_each(
    results, tmp_path
):
    """`algo=dapo optim.lr=3e-3` on the default run: dynamic sampling falls short on ~200 of 300 steps
    with a different count each time. The console says it at its 1st, 10th and 100th time and sums up
    the rest at the end; a different alert still prints at once; train.log has every one."""
    steps = []
    for step in range(1, 301):
        alerts = [f"dynamic sampling: {step % 7} group(s) with a signal after 4 draw(s): training on {step % 7}"]
        alerts += ["reward hacking: the reward rose"] if step == 150 else []
        steps.append(dataclasses.replace(results[0], step=step, alerts=alerts))
    log_file = logging.FileHandler(tmp_path / "train.log")
    logging.getLogger().addHandler(log_file)
    try:
        out = printed("plain", steps, terminal=False, print_every=1000)
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    alert_lines = [line for line in out.splitlines() if line.startswith("alert")]
    assert [line.split(":")[0] for line in alert_lines] == [
        "alert (step 1)",
        "alert (step 10, 10th time since step 1)",
        "alert (step 100, 100th time since step 1)",
        "alert (step 150)",
        "alert repeated 300 times, steps 1-300 (297 not printed; every one is in train.log), the last",
    ]
    assert alert_lines[-1].endswith("training on 6")  # step 300's own figure
    logged = (tmp_path / "train.log").read_text()
    assert logged.count("dynamic sampling:") == 301 and logged.count("alert (step") == 301


def test_logged_steps_print_their_completions_with_rewards(results):
    out = printed("plain", results, terminal=False, print_every=10, completions_every=2, completions_to_print=2)
    shown = [line for line in out.splitlines() if line.startswith("step 2 ") and "->" in line]
    assert len(shown) == 2
    sample = results[1].samples[0]
    assert repr(sample["completion"]) in shown[0] and "partial_credit" in shown[0]


def test_a_multi_turn_completion_prints_each_turn_under_its_line(results):
    turns = [
        {"role": "assistant", "content": "def f(x): return x"},
        {"role": "user", "content": "Your code passed 0 of 2 tests."},
        {"role": "assistant", "content": "def f(x): return 2 * x"},
    ]
    result = copy.deepcopy(results[1])
    result.samples[0]["messages"] = turns
    out = printed("plain", [result], terminal=False, completions_every=1, completions_to_print=2)
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if "->" in line)
    assert lines[first + 1 : first + 4] == [
        "    1. assistant 'def f(x): return x'",
        "    2. user 'Your code passed 0 of 2 tests.'",
        "    3. assistant 'def f(x): return 2 * x'",
    ]
    assert "    1. " not in "\n".join(lines[first + 4 :])  # a one-turn completion prints no turns
