"""DAPO's dynamic sampling (`algo.dynamic_sampling`, training/dynamic_sampling.py) through the real
GRPOTrainer and the tiny model: constant groups are dropped and the step refilled from the seeded
sampler, a short batch trains on what it has (a skipped update when nothing has a signal), and a
Ctrl-C in the middle of a refill resumes to the uninterrupted run, bit for bit.

The rewards below are importable by path (`tests.training.test_dynamic_sampling:...`), as a user's
are; which groups carry a signal is decided by the prompt, so the expected draws and drops follow
from the sampler's order alone (`expected`)."""

from __future__ import annotations

import io
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.core.clip import AdaptiveClip
from grpo_cli.data import PromptSampler
from grpo_cli.monitor import MetricsFile, TrainingConsole
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics, reproducible

SIGNAL_PROMPTS: set[str] = set()  # signal_for_chosen_prompts: set by the test before the run
INTERRUPT_AT_CALL = 0  # parity_then_interrupt: 0 never; set by the test, so the config stays the same
calls = 0


def distinct(i: int) -> float:
    """A reward that differs between any two rows of a batch, so a group's rows differ."""
    return float(i)


def parity(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1.0 on every completion of a prompt whose answer is even (a constant group); otherwise the
    row's position in the batch (distinct within every group: a signal).

    >>> parity(["2+2=", "2+2=", "1+2=", "1+2="], ["a", "b", "c", "d"], ["4", "4", "3", "3"])
    [1.0, 1.0, 2.0, 3.0]
    """
    return [1.0 if int(a) % 2 == 0 else distinct(i) for i, a in enumerate(answer)]


def signal_for_chosen_prompts(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """A signal only for the prompts in SIGNAL_PROMPTS; every other group is constant."""
    return [distinct(i) if p in SIGNAL_PROMPTS else 0.5 for i, p in enumerate(prompts)]


def parity_then_interrupt(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """`parity`, pressing Ctrl-C on call INTERRUPT_AT_CALL (one call per draw: the test picks a refill's)."""
    global calls
    calls += 1
    if calls == INTERRUPT_AT_CALL:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, where this runs (timeout_s=0)
    return parity(prompts, completions, answer)


def config(reward: str, steps: int, max_draws: int, mini_batches: int = 1) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 4, 4
    cfg.rollout.max_new_tokens = 4
    cfg.data.num_examples = 60
    cfg.algo.mini_batches = mini_batches
    cfg.algo.dynamic_sampling.enabled, cfg.algo.dynamic_sampling.max_draws = True, max_draws
    cfg.reward.timeout_s = 0  # in the main thread: the Ctrl-C of parity_then_interrupt lands there
    target = f"tests.training.test_dynamic_sampling:{reward}"
    cfg.reward.functions = [RewardFunctionConfig(name=reward, target=target)]
    cfg.monitor.plots = False
    return cfg


def run(cfg: TrainConfig, run_dir: Path, *observers: Any) -> tuple[GRPOTrainer, list[torch.Tensor]]:
    """Train to the end; the trainer and its final weights."""
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    trainer = GRPOTrainer(cfg, run_dir, [*observers, metrics])
    try:
        trainer.setup()
        for observer in observers:
            if isinstance(observer, Weights):
                observer.model = trainer.model
        trainer.train()
        return trainer, [p.detach().clone() for p in trainer.model.parameters()]
    finally:
        metrics.close()
        trainer.cleanup()


class Samples:
    """The prompts of each step's logged samples (the first 2·G completions: two groups)."""

    def __init__(self, into: list[list[str]]) -> None:
        self.into = into

    def on_step(self, result: Any) -> None:
        self.into.append(list(dict.fromkeys(sample["prompt"] for sample in result.samples)))


class Weights:
    """The policy's weights after each step."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None  # set by run() once the trainer is set up
        self.after: list[list[torch.Tensor]] = []

    def on_step(self, result: Any) -> None:
        assert self.model is not None
        self.after.append([p.detach().clone() for p in self.model.parameters()])


def train_examples(cfg: TrainConfig, tmp_path: Path) -> list[dict[str, Any]]:
    """The training split in the trainer's own order, read from a trainer that was only set up."""
    trainer = GRPOTrainer(cfg, tmp_path / "split")
    trainer.setup()
    examples = trainer.train_examples
    trainer.cleanup()
    return examples


def expected(
    examples: list[dict[str, Any]], cfg: TrainConfig, has_signal: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Each step's draws, drops and kept prompts as the spec describes them, from the seeded sampler:
    rounds of prompts_per_step prompts until that many have a signal or max_draws rounds ran."""
    sampler, per_step = PromptSampler(examples, cfg.train.seed), cfg.train.prompts_per_step
    steps = []
    for _ in range(cfg.train.steps):
        drawn: list[dict[str, Any]] = []
        while len(drawn) < per_step * cfg.algo.dynamic_sampling.max_draws:
            drawn += sampler.next_batch(per_step)
            if sum(map(has_signal, drawn)) >= per_step:
                break
        signal_prompts = [ex["prompt"] for ex in drawn if has_signal(ex)]
        kept = signal_prompts[:per_step]
        steps.append({"draws": len(drawn) // per_step, "dropped": len(drawn) - len(signal_prompts), "kept": kept})
    return steps


def odd(example: dict[str, Any]) -> bool:
    return int(example["answer"]) % 2 == 1


def test_constant_groups_are_dropped_and_the_step_refilled(tmp_path: Path) -> None:
    cfg = config("parity", steps=3, max_draws=8)
    plan = expected(train_examples(cfg, tmp_path), cfg, odd)
    assert any(step["draws"] > 1 for step in plan)  # the premise: some step needs a refill
    samples: list[list[str]] = []
    trainer, _ = run(cfg, tmp_path / "run", Samples(samples))
    for row, step, first in zip(trainer.history, plan, samples, strict=True):
        assert row["sampling/groups_kept"] == 4 and row["frac_zero_std_groups"] == 0.0  # full, all with a signal
        assert row["sampling/draws"] == step["draws"] and row["sampling/groups_dropped"] == step["dropped"]
        assert row["sampling/groups_generated"] == 4 * step["draws"]
        assert row["sampling/groups_excess"] == 4 * step["draws"] - step["dropped"] - 4
        assert row["sampling/signal_frac"] == (4 * step["draws"] - step["dropped"]) / (4 * step["draws"])
        assert row["optimizer_steps"] == 1
        assert first == step["kept"][:2]  # the completion log's first groups: the first signal prompts drawn
    assert len(trainer.history) == 3


def test_a_short_batch_trains_on_what_it_has_and_none_skips_the_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1: one signal group in 2 draws (algo.mini_batches=2 is cut to 1); step 2: none, the update
    is skipped and the weights stay; step 3: three, two mini-batches. Each short step alerts."""
    cfg = config("signal_for_chosen_prompts", steps=3, max_draws=2, mini_batches=2)
    cfg.algo.beta = 0.04  # a KL figure to check on the skipped step
    sampler = PromptSampler(train_examples(cfg, tmp_path), cfg.train.seed)
    draws = [[ex["prompt"] for ex in sampler.next_batch(8)] for _ in range(3)]  # each step's two draws
    assert len({p for draw in draws for p in draw}) == 24  # no prompt twice: a signal only where chosen
    monkeypatch.setattr(sys.modules[__name__], "SIGNAL_PROMPTS", {draws[0][5], *draws[2][1:4]})
    weights, out, samples = Weights(), io.StringIO(), []
    with TrainingConsole(3, "plain", Console(file=out, width=200)) as console:
        trainer, _ = run(cfg, tmp_path / "run", console, weights, Samples(samples))
    assert samples[1] == draws[1][4:6]  # the skipped step reports its last draw (the fusion's state saw it)
    assert [r["sampling/groups_kept"] for r in trainer.history] == [1, 0, 3]
    assert [r["sampling/draws"] for r in trainer.history] == [2, 2, 2]
    assert [r["sampling/groups_dropped"] for r in trainer.history] == [7, 8, 5]
    assert [r["optimizer_steps"] for r in trainer.history] == [1, 0, 2]
    for key in ("loss", "kl", "clip_frac"):  # the skipped step measured nothing: no figure rather than 0
        assert [math.isnan(r[key]) for r in trainer.history] == [False, True, False], key
    first, skipped, last = weights.after
    assert all(torch.equal(a, b) for a, b in zip(first, skipped, strict=True))  # the skipped step left them alone
    assert not all(torch.equal(a, b) for a, b in zip(skipped, last, strict=True))
    log = out.getvalue()
    assert "1 group(s) with a signal after 2 draw(s)" in log and "training on 1 of train.prompts_per_step=4" in log
    assert "algo.mini_batches=2 > 1 group(s) per process: 1 mini-batch(es) this step" in log
    assert "0 group(s) with a signal after 2 draw(s) of 4 prompts" in log and "update skipped" in log
    assert "training on 3 of train.prompts_per_step=4" in log
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_ctrl_c_in_the_middle_of_a_refill_resumes_to_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config("parity_then_interrupt", steps=3, max_draws=8)
    plan = expected(train_examples(cfg, tmp_path), cfg, odd)
    refilled = next(i for i in range(1, len(plan)) if plan[i]["draws"] > 1)  # a step after the first, refilled
    second_draw = sum(step["draws"] for step in plan[:refilled]) + 2  # the reward's call for its second draw
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "calls", 0)
    _, straight = run(cfg, tmp_path / "straight")
    monkeypatch.setattr(module, "calls", 0)
    monkeypatch.setattr(module, "INTERRUPT_AT_CALL", second_draw)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "resumed")
    assert module.calls == second_draw
    saved = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir())
    assert saved == [f"step_{refilled:06d}"]  # the step interrupted mid-refill was rolled back
    monkeypatch.setattr(module, "INTERRUPT_AT_CALL", 0)
    _, resumed = run(cfg, tmp_path / "resumed")  # train.resume=auto
    assert reproducible(read_metrics(tmp_path / "resumed")) == reproducible(read_metrics(tmp_path / "straight"))
    assert all(torch.equal(a, b) for a, b in zip(resumed, straight, strict=True))


def parity_rows(draw: list[dict[str, Any]]) -> list[list[float]]:
    """`parity`'s values for one draw, group by group (row i of the draw's batch: prompt·G + k)."""
    return [[1.0 if not odd(ex) else distinct(4 * group + k) for k in range(4)] for group, ex in enumerate(draw)]


def test_the_reward_figures_are_the_generated_batch_s_and_the_controllers_read_them(tmp_path: Path) -> None:
    """Issue 33 item 3: the reward figures read only the kept groups, so dropping the all-equal groups
    pulled them to the middle (a policy at 75% logged 0.25), and the adaptive clip, the guard, the
    hacking alert and the sweep objective read that. They are the generated batch's now (every draw),
    the kept groups' mean is sampling/kept_reward_mean, and the clip reads the generated figure."""
    cfg = config("parity", steps=3, max_draws=8)
    cfg.algo.adaptive_clip.enabled, cfg.algo.adaptive_clip.window = True, 2
    examples = train_examples(cfg, tmp_path)
    plan = expected(examples, cfg, odd)
    trainer, _ = run(cfg, tmp_path / "run")
    clip = AdaptiveClip(cfg.algo.adaptive_clip, cfg.algo.epsilon_low, cfg.algo.epsilon_high)
    sampler = PromptSampler(examples, cfg.train.seed)
    generated_means, kept_means = [], []
    for step in plan:
        draws = [sampler.next_batch(4) for _ in range(step["draws"])]
        rows = [(ex, values) for draw in draws for ex, values in zip(draw, parity_rows(draw), strict=True)]
        kept = [values for ex, values in rows if odd(ex)][:4]
        generated_means.append(sum(v for _, values in rows for v in values) / (16 * step["draws"]))
        kept_means.append(sum(map(sum, kept)) / 16)
    assert [r["reward/raw_mean"] for r in trainer.history] == pytest.approx(generated_means)
    assert [r["reward/parity/mean"] for r in trainer.history] == pytest.approx(generated_means)
    assert [r["sampling/kept_reward_mean"] for r in trainer.history] == pytest.approx(kept_means)
    assert generated_means != pytest.approx(kept_means)  # the premise: dropping groups moves the mean
    for row in trainer.history:  # the adaptive clip saw the generated batch's raw mean, step by step
        assert clip.epsilons(row["reward/raw_mean"]) == pytest.approx(
            (row["clip/epsilon_low"], row["clip/epsilon_high"])
        )


def failing(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    raise RuntimeError("scorer down")


def test_the_kept_batch_updates_the_fusion_s_failure_counts(tmp_path: Path) -> None:
    """The final fusion of a step is the one that updates the running state: a function failing on
    every draw is counted once a step and masked after reward.max_consecutive_failures steps (with
    read-only fusions only, it would never be, and its weight never move to a fallback)."""
    cfg = config("parity", steps=3, max_draws=2)
    cfg.reward.max_consecutive_failures = 2
    target = "tests.training.test_dynamic_sampling:failing"
    cfg.reward.functions.append(RewardFunctionConfig(name="failing", target=target, fallback="parity"))
    trainer, _ = run(cfg, tmp_path / "run")
    assert [r["reward/masked_functions"] for r in trainer.history] == [0, 1, 1]
    assert [r["weight/parity"] for r in trainer.history] == [1.0, 2.0, 2.0]
