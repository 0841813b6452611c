"""Long work nobody watches on a terminal still says how far it is, at least every HEARTBEAT_S."""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path

import pytest
from rich.console import Console

from grpo_cli.config.schema import TrainConfig
from grpo_cli.monitor.console import TrainingConsole
from grpo_cli.monitor.heartbeat import HEARTBEAT_S, Heartbeat
from grpo_cli.monitor.progress import PromptProgress
from grpo_cli.training import GRPOTrainer


def plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=200)


def test_a_silent_stretch_gets_a_line_with_done_total_and_an_eta(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="grpo")
    with Heartbeat("eval: sampled", 100, "prompts", enabled=True, every_s=0.05) as beat:
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:  # however late a busy machine runs it
            time.sleep(0.01)
        assert beat.line().startswith("eval: sampled: 0/100 prompts") and beat.eta() == "-"  # no rate yet
        beat.start = time.monotonic() - 10  # 25 prompts in 10 s: 75 to go take 30 s
        beat.advance(25)
        assert beat.line().startswith("eval: sampled: 25/100 prompts") and beat.eta() == "30s"
    first = [r.getMessage() for r in caplog.records if r.name == "grpo"][0]
    assert first.startswith("eval: sampled: 0/100 prompts") and first.endswith("ETA -")


def test_a_line_printed_elsewhere_resets_the_clock(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="grpo")
    with Heartbeat("train", 10, "steps", enabled=True, every_s=0.3) as beat:
        for _ in range(6):
            time.sleep(0.1)
            beat.touch()
    assert not [r for r in caplog.records if r.name == "grpo"]


def test_plain_output_beats_and_a_terminal_or_quiet_one_does_not() -> None:
    assert HEARTBEAT_S <= 30
    assert TrainingConsole(10, "auto", plain_console()).heartbeat.enabled
    assert not TrainingConsole(10, "quiet", plain_console()).heartbeat.enabled
    assert not TrainingConsole(10, "rich", plain_console()).heartbeat.enabled
    assert PromptProgress("rollout", 10, "auto", plain_console()).heartbeat.enabled
    assert not PromptProgress("rollout", 10, "quiet", plain_console()).heartbeat.enabled


def test_a_resumed_run_counts_its_steps_but_not_towards_the_rate() -> None:
    progress = TrainingConsole(100, "plain", plain_console())
    progress.resumed_at(40)
    beat = progress.heartbeat
    assert beat.line().startswith("train: 40/100 steps") and beat.eta() == "-"
    beat.start = time.monotonic() - 10  # one step of this run in 10 s: 59 to go take 590 s, not 59 * 10 / 41
    beat.advance(1)
    assert beat.eta() == "9m50s"


def test_between_steps_the_line_says_what_the_step_is_doing(tmp_path: Path) -> None:
    """A real model's first step takes minutes (`train: 0/2 steps, 10m00s elapsed, ETA -` said
    nothing): the line names the stage the trainer reports, sampling (tokens of
    rollout.max_new_tokens), scoring, training (micro-batch k of the update's n), and drops it once
    the step is done."""
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, 2, 4
    # 2 iterations x 2 mini-batches (one group each) x 2 accumulated micro-batches: 8 passes
    cfg.algo.num_iterations, cfg.algo.mini_batches, cfg.train.grad_accum_steps = 2, 2, 2
    progress = TrainingConsole(cfg.train.steps, "plain", plain_console())
    said: list[str] = []

    def report(stage: str, done: int, total: int) -> None:
        progress.stage(stage, done, total)
        said.append(progress.heartbeat.line().split("; ", 1)[1])

    trainer = GRPOTrainer(cfg, tmp_path, [progress])
    trainer.report_stage = report
    trainer.setup()
    with progress:
        trainer.train()
    trainer.cleanup()
    budget = cfg.rollout.max_new_tokens
    assert said[0] == "step 1: sampling"  # before the first token: all a loop that counts none can say
    sampled = [line for line in said[1:] if "sampling" in line]
    assert 1 <= len(sampled) <= budget
    assert sampled == [f"step 1: sampling, {k}/{budget} tokens" for k in range(1, len(sampled) + 1)]
    training = [f"step 1: training, micro-batch {k}/8" for k in range(1, 9)]
    assert said[1 + len(sampled) :] == ["step 1: scoring", *training]
    assert progress.heartbeat.line().startswith("train: 1/1 steps") and "; " not in progress.heartbeat.line()


def test_the_live_panel_shows_the_stage_too() -> None:
    buffer = io.StringIO()
    with TrainingConsole(2, "rich", Console(file=buffer, force_terminal=True, width=100)) as shown:
        shown.stage("training", 3, 8)
        shown.live.refresh()
    assert "step 1: training, micro-batch 3/8" in buffer.getvalue()
