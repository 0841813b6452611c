"""SIGTERM stops a run as Ctrl-C does (training/interrupt.py): a cluster preempts with SIGTERM, and
the run must leave its last finished step saved, resumable to exactly the uninterrupted run.

In-process, one process; tests/e2e/test_preemption.py sends SIGTERM to `grpo train` (one process
and two) and resumes with the command it prints.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.interrupt import Interrupted, exit_code
from tests.conftest import read_metrics, reproducible

THIS = sys.modules[__name__]
TERMINATE_AT_CALL = 0  # length_then_terminate: 0 never; set by a test, so the config stays the same
calls = 0


def length_then_terminate(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """A reward that sends this process SIGTERM on a chosen call: a preemption while a step is scored."""
    global calls
    calls += 1
    if calls == TERMINATE_AT_CALL:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread, where this runs (timeout_s=0)
    return [float(len(c)) for c in completions]


DROP_AT_CALL = 0  # length_then_dropped_sigterm: 0 never


class Collected:
    """An object whose __del__ takes SIGTERM: Python drops what a __del__ raises ("Exception ignored")."""

    def __del__(self) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            handler(signal.SIGTERM, None)  # the handler runs inside the __del__, as a signal landing there does


def length_then_dropped_sigterm(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """A reward during whose call a SIGTERM lands inside a __del__ (the garbage collector's, in a real run)."""
    global calls
    calls += 1
    if calls == DROP_AT_CALL:
        Collected()  # made and collected at once
    return [float(len(c)) for c in completions]


def config() -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 4, 4, 4
    cfg.data.num_examples = 200
    cfg.reward.timeout_s = 0  # in the main thread, where the signal lands
    target = f"{__name__}:length_then_terminate"
    cfg.reward.functions = [RewardFunctionConfig(name="length", target=target)]
    return cfg


def run(run_dir: Path, *observers: object, cfg: TrainConfig | None = None) -> GRPOTrainer:
    cfg = cfg if cfg is not None else config()
    trainer = GRPOTrainer(cfg, run_dir, [*observers, MetricsFile(run_dir / "metrics.jsonl")])
    trainer.setup()
    try:
        trainer.train()
    finally:
        trainer.observers[-1].close()
        trainer.cleanup()
    return trainer


class SignalAt:
    """Sends these signals while the observers of a step run (its weights have moved, its metrics
    line is not written yet)."""

    def __init__(self, step: int, *signals: signal.Signals) -> None:
        self.step, self.signals = step, signals

    def on_step(self, result: StepResult) -> None:
        if result.step == self.step:
            for signum in self.signals:
                os.kill(os.getpid(), signum)


@pytest.fixture
def sigterm_fails_the_test() -> Iterator[None]:
    """Unhandled, SIGTERM would end pytest itself: here it fails the test instead. The trainer puts
    back the handler it found."""

    def unhandled(signum: int, frame: object) -> None:
        raise AssertionError("SIGTERM reached the handler outside the trainer: the trainer did not handle it")

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield
    assert signal.getsignal(signal.SIGTERM) is unhandled
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    run_dir = tmp_path_factory.mktemp("straight")
    run(run_dir)
    return reproducible(read_metrics(run_dir))


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


@pytest.mark.usefixtures("sigterm_fails_the_test")
def test_sigterm_after_the_weights_move_saves_that_step_and_resumes_exactly(tmp_path: Path, straight: list[dict]):
    with pytest.raises(Interrupted) as stop:
        run(tmp_path, SignalAt(2, signal.SIGTERM))
    assert stop.value.signum == signal.SIGTERM and exit_code(stop.value) == 143  # 128 + 15, as the shell says
    assert checkpoints(tmp_path) == ["step_000002"]  # deferred to the end of step 2, then saved
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]
    run(tmp_path)  # train.resume=auto
    assert reproducible(read_metrics(tmp_path)) == straight


@pytest.mark.usefixtures("sigterm_fails_the_test")
def test_sigterm_while_scoring_rolls_the_step_back(
    tmp_path: Path, straight: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(THIS, "calls", 0)
    monkeypatch.setattr(THIS, "TERMINATE_AT_CALL", 3)  # step 3 is scored
    with pytest.raises(Interrupted):
        run(tmp_path)
    assert checkpoints(tmp_path) == ["step_000002"]  # step 3 never moved the weights: undone, step 2 saved
    monkeypatch.setattr(THIS, "TERMINATE_AT_CALL", 0)
    run(tmp_path)
    assert reproducible(read_metrics(tmp_path)) == straight


@pytest.mark.usefixtures("sigterm_fails_the_test")
def test_a_repeated_sigterm_still_saves_but_a_ctrl_c_after_it_stops_at_once(tmp_path: Path) -> None:
    """A cluster's SIGTERM reaches every process of the job, and torchrun passes on another: the
    repeat must not cost the checkpoint. A Ctrl-C on top is a user who means it."""
    with pytest.raises(Interrupted):
        run(tmp_path / "twice", SignalAt(2, signal.SIGTERM, signal.SIGTERM))
    assert checkpoints(tmp_path / "twice") == ["step_000002"]
    with pytest.raises(Interrupted) as stop:
        run(tmp_path / "then_ctrl_c", SignalAt(2, signal.SIGTERM, signal.SIGINT))
    assert stop.value.signum == signal.SIGINT
    assert not (tmp_path / "then_ctrl_c" / "checkpoints").exists()  # stopped inside the step: nothing saved


class SigtermWhenSaved:
    """A train-state part that sends SIGTERM when a checkpoint reads it after a rollback: the
    cluster's repeated SIGTERM landing while the rolled-back step is being saved."""

    def __init__(self) -> None:
        self.rolled_back = False

    def state_dict(self) -> dict:
        if self.rolled_back:
            self.rolled_back = False
            os.kill(os.getpid(), signal.SIGTERM)
        return {}

    def load_state_dict(self, state: dict) -> None:
        self.rolled_back = True


@pytest.mark.usefixtures("sigterm_fails_the_test")
def test_a_second_sigterm_while_the_rolled_back_step_is_saved_keeps_the_checkpoint(
    tmp_path: Path, straight: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(THIS, "calls", 0)
    monkeypatch.setattr(THIS, "TERMINATE_AT_CALL", 3)  # step 3 is scored: rolled back, step 2 saved
    trainer = GRPOTrainer(config(), tmp_path, [MetricsFile(tmp_path / "metrics.jsonl")])
    trainer.setup()
    trainer.state.register("sigterm_when_saved", SigtermWhenSaved())
    try:
        with pytest.raises(Interrupted) as stop:
            trainer.train()
    finally:
        trainer.observers[-1].close()
        trainer.cleanup()
    assert stop.value.signum == signal.SIGTERM
    assert checkpoints(tmp_path) == ["step_000002"]  # the second SIGTERM waited for the write
    monkeypatch.setattr(THIS, "TERMINATE_AT_CALL", 0)
    run(tmp_path)
    assert reproducible(read_metrics(tmp_path)) == straight


@pytest.mark.usefixtures("sigterm_fails_the_test")
def test_a_sigterm_dropped_inside_a_del_is_obeyed_at_the_next_step(
    tmp_path: Path, straight: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python drops an exception raised while a __del__ runs: a SIGTERM landing there (while step 3
    is scored) would be lost and the run would go on to its end. The step finishes, and the next one
    obeys it: step 3 saved, then the resume trains what the straight run did."""
    monkeypatch.setattr(THIS, "calls", 0)
    monkeypatch.setattr(THIS, "DROP_AT_CALL", 3)
    cfg = config()
    cfg.reward.functions[0].target = f"{__name__}:length_then_dropped_sigterm"
    with pytest.raises(Interrupted) as stop:
        run(tmp_path, cfg=cfg)
    assert stop.value.signum == signal.SIGTERM
    assert checkpoints(tmp_path) == ["step_000003"]
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2, 3]
    monkeypatch.setattr(THIS, "DROP_AT_CALL", 0)
    run(tmp_path, cfg=cfg)
    assert reproducible(read_metrics(tmp_path)) == straight
