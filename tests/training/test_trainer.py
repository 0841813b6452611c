"""GRPOTrainer as a library user drives it: `TrainConfig()` is the default run, setup validates,
evaluation scores one greedy answer per prompt, a step is finished only when its observers have
run, and a resume refuses a config that changes the maths."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from grpo_cli.config.schema import DataConfig, RewardFunctionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics, reproducible
from tests.training import interrupting_rewards


def small_config(**train) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps = train.pop("steps", 4)
    cfg.train.prompts_per_step = 4
    cfg.rollout.num_generations = 4
    cfg.data.num_examples = 200
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def run(cfg: TrainConfig, run_dir: Path, *observers) -> GRPOTrainer:
    trainer = GRPOTrainer(cfg, run_dir, [*observers, MetricsFile(run_dir / "metrics.jsonl")])
    trainer.setup()
    try:
        trainer.train()
    finally:
        for observer in trainer.observers:
            if isinstance(observer, MetricsFile):
                observer.close()
        trainer.cleanup()
    return trainer


def test_the_default_config_trains_with_its_rewards(tmp_path: Path) -> None:
    trainer = GRPOTrainer(TrainConfig(), tmp_path)
    trainer.setup()
    result = trainer.step()
    assert [s.name for s in trainer.reward_sources] == ["exact_match", "partial_credit"]
    assert result.metrics["reward/partial_credit/mean"] > 0
    assert result.metrics["grad_norm"] > 0 and result.metrics["optimizer_steps"] == 1  # a real update
    trainer.cleanup()


def test_setup_validates_the_config(tmp_path: Path) -> None:
    cfg = TrainConfig()
    cfg.reward.functions = []
    with pytest.raises(GrpoError, match="reward.functions is empty"):
        GRPOTrainer(cfg, tmp_path).setup()
    cfg = TrainConfig()
    cfg.rollout.num_generations = 1
    with pytest.raises(GrpoError, match="rollout.num_generations"):
        GRPOTrainer(cfg, tmp_path).setup()


@pytest.mark.parametrize("setting", ["normalize_then_sum", "group_zscore"])
def test_evaluation_scores_a_group_of_one(tmp_path: Path, setting: str) -> None:
    """At G=1 a group z-score is 0 by construction: eval used to report a reward of 0."""
    cfg = small_config(steps=2, eval_every=1)
    length = RewardFunctionConfig(name="length", target="tests.rewards.pool_functions:length", weight=1.0)
    exact = RewardFunctionConfig(name="exact_match", target="exact_match", weight=3.0)
    if setting == "normalize_then_sum":
        cfg.reward.aggregation = "normalize_then_sum"
    else:
        length.normalize = "group_zscore"
    cfg.reward.functions = [length, exact]
    trainer = run(cfg, tmp_path)
    assert [row["step"] for row in trainer.history] == [1, 2]
    for row in trainer.history:  # train.eval_every=1: every step carries the eval figures
        raw_length, raw_exact = row["eval/reward/length/mean"], row["eval/reward/exact_match/mean"]
        assert raw_length >= 1.0  # raw characters, not a z-score
        assert row["eval/reward/mean"] == pytest.approx((1.0 * raw_length + 3.0 * raw_exact) / 4.0)
    assert read_metrics(tmp_path)[0]["eval/reward/mean"] == trainer.history[0]["eval/reward/mean"]


def test_eval_success_picks_the_function_eval_accuracy_counts(tmp_path: Path) -> None:
    """`length` (first) scores every answer >= 1 character: solved under the default rule; with
    eval.success=exact_match the accuracy is the exact-match rate instead. A typo fails in setup."""
    cfg = small_config(steps=1, eval_every=1)
    length = RewardFunctionConfig(name="length", target="tests.rewards.pool_functions:length")
    cfg.reward.functions = [length, RewardFunctionConfig(name="exact_match", target="exact_match")]
    default = run(cfg, tmp_path / "default").history[0]
    assert default["eval/accuracy"] == 1.0
    cfg.eval.success = "exact_match"
    chosen = run(cfg, tmp_path / "exact").history[0]
    assert chosen["eval/accuracy"] == chosen["eval/reward/exact_match/mean"] < 1.0
    cfg.eval.success = "exact_mtch"
    with pytest.raises(GrpoError, match="did you mean exact_match"):
        GRPOTrainer(cfg, tmp_path / "typo").setup()


class InterruptAt:
    """Ctrl-C while the observers of a step run, before the metrics line is written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, result: StepResult) -> None:
        if result.step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_in_the_observers_saves_the_step_its_metrics_line_describes(tmp_path: Path) -> None:
    straight = run(small_config(), tmp_path / "straight")
    interrupted = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run(small_config(), interrupted, InterruptAt(2))
    checkpoints = sorted(p.name for p in (interrupted / "checkpoints").iterdir())
    assert checkpoints == ["step_000002"]
    assert [row["step"] for row in read_metrics(interrupted)] == [1, 2]
    run(small_config(), interrupted)  # train.resume=auto
    assert reproducible(read_metrics(interrupted)) == reproducible(read_metrics(tmp_path / "straight"))
    assert len(straight.history) == 4


def test_ctrl_c_while_scoring_rolls_the_step_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def config() -> TrainConfig:
        cfg = small_config()
        cfg.reward.timeout_s = 0  # in the main thread, where the signal lands
        target = "tests.training.interrupting_rewards:length_then_interrupt"
        cfg.reward.functions = [RewardFunctionConfig(name="length", target=target)]
        return cfg

    run(config(), tmp_path / "straight")
    monkeypatch.setattr(interrupting_rewards, "calls", 0)
    monkeypatch.setattr(interrupting_rewards, "INTERRUPT_AT_CALL", 3)  # while step 3 is scored
    with pytest.raises(KeyboardInterrupt):
        run(config(), tmp_path / "resumed")
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["step_000002"]
    monkeypatch.setattr(interrupting_rewards, "INTERRUPT_AT_CALL", 0)
    run(config(), tmp_path / "resumed")
    assert reproducible(read_metrics(tmp_path / "resumed")) == reproducible(read_metrics(tmp_path / "straight"))


def test_a_resume_refuses_changes_to_the_maths(tmp_path: Path) -> None:
    run(small_config(steps=2, save_every=2), tmp_path)
    changed = small_config(steps=3)
    changed.rollout.num_generations = 2
    changed.optim.lr = 1e-3
    with pytest.raises(GrpoError) as info:
        GRPOTrainer(changed, tmp_path).setup()
    message = str(info.value)
    assert "rollout.num_generations: 4 -> 2" in message and "optim.lr: 0.002 -> 0.001" in message
    assert "train.resume_allow_changes=true" in message

    longer = small_config(steps=3)  # more steps, other logging: the same maths
    longer.monitor.log_completions_every = 1
    assert [row["step"] for row in run(longer, tmp_path).history] == [1, 2, 3]

    changed.train.resume_allow_changes = True
    changed.train.steps = 4
    assert [row["step"] for row in run(changed, tmp_path).history][-1] == 4


def test_resume_from_an_explicit_checkpoint_and_never(tmp_path: Path) -> None:
    first = tmp_path / "first"
    run(small_config(steps=3, save_every=2), first)
    second = small_config(steps=3, save_every=2, resume=str(first / "checkpoints" / "step_000002"))
    assert [row["step"] for row in run(second, tmp_path / "second").history] == [3]
    assert [row["step"] for row in read_metrics(tmp_path / "second")] == [3]
    assert reproducible(read_metrics(tmp_path / "second")) == reproducible(read_metrics(first)[2:])
    run(small_config(steps=3, save_every=2, resume="never"), first)
    assert [row["step"] for row in read_metrics(first)] == [1, 2, 3]  # started over, no duplicated lines
    with pytest.raises(GrpoError, match="not a complete checkpoint"):
        GRPOTrainer(small_config(resume=str(tmp_path)), tmp_path / "x").setup()


def _prompt_file(path: Path, lengths: list[int]) -> Path:
    rows = [{"prompt": "x" * n + "1+1=", "answer": "2"} for n in lengths]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("policy", ["error", "skip", "truncate_left"])
def test_prompts_longer_than_the_model_context(tmp_path: Path, policy: str) -> None:
    """The tiny model has 256 positions; 512 prompt tokens + 8 new ones cannot fit."""
    cfg = small_config(steps=1)
    cfg.data = DataConfig(kind="jsonl")  # the jsonl group's keys only: data.num_examples is arithmetic's
    cfg.data.path = str(_prompt_file(tmp_path / "p.jsonl", [0, 10, 400, 0, 20, 300, 5, 0]))
    cfg.data.eval_fraction = 0.0
    cfg.data.max_prompt_tokens = 512
    cfg.data.on_long_prompt = policy
    cfg.rollout.max_new_tokens = 8
    trainer = GRPOTrainer(cfg, tmp_path / "run")
    if policy == "error":
        with pytest.raises(GrpoError, match=r"2 of 8 train prompts are longer than 248 tokens .*has 404"):
            trainer.setup()
        return
    trainer.setup()
    assert trainer.encoder.max_tokens == 248  # 256 positions - 8 new tokens
    assert trainer.prompt_budget.long_prompts == 2
    if policy == "skip":
        assert len(trainer.train_examples) == 6 and trainer.prompt_budget.skipped_prompts == 2
    else:
        assert len(trainer.train_examples) == 8 and trainer.prompt_budget.truncated_prompts == 2
    result = trainer.step()  # every prompt + completion fits the model's positions
    assert result.metrics["completion_len/max"] <= 8
    trainer.cleanup()


@pytest.mark.parametrize(
    ("examples", "eval_fraction", "prompts_per_step", "said"),
    [
        (
            3,
            0.0,
            4,
            r"^train.prompts_per_step=4 is more than the 3 training example\(s\) \(3 in the data, 0 held out "
            r"by data.eval_fraction\): set train.prompts_per_step to at most 3, or give more data$",
        ),
        (
            10,
            0.5,
            6,
            r"^train.prompts_per_step=6 is more than the 5 training example\(s\) \(10 in the data, 5 held "
            r"out by data.eval_fraction\)",
        ),
        (  # the data's own key, not the step's (issue 52, item 17)
            0,
            0.1,
            4,
            r"^invalid value data.num_examples=0: must be at least 1$",
        ),
    ],
)
def test_a_step_the_training_data_cannot_fill_is_refused_at_setup(
    tmp_path: Path, examples: int, eval_fraction: float, prompts_per_step: int, said: str
) -> None:
    """No examples used to leave PromptSampler.next_batch waiting forever; fewer than a step's
    prompts drew some of them twice in every step."""
    cfg = small_config(steps=1, prompts_per_step=prompts_per_step)
    cfg.data.num_examples, cfg.data.eval_fraction = examples, eval_fraction
    trainer = GRPOTrainer(cfg, tmp_path / "run")
    with pytest.raises(GrpoError, match=said):
        trainer.setup()
    assert not (tmp_path / "run").exists()  # refused before any model was built


def test_a_step_the_prompts_left_after_skipping_long_ones_cannot_fill_is_refused(tmp_path: Path) -> None:
    cfg = small_config(steps=1, prompts_per_step=4)
    cfg.data = DataConfig(kind="jsonl")  # the jsonl group's keys only: data.num_examples is arithmetic's
    cfg.data.path = str(_prompt_file(tmp_path / "p.jsonl", [0, 400, 300, 0, 5]))
    cfg.data.eval_fraction = 0.0
    cfg.data.max_prompt_tokens = 512
    cfg.data.on_long_prompt = "skip"
    cfg.rollout.max_new_tokens = 8
    with pytest.raises(
        GrpoError,
        match=r"^train.prompts_per_step=4 is more than the 3 training example\(s\) \(5 in the data, 0 held out by "
        r"data.eval_fraction; 2 skipped as too long \(data.on_long_prompt=skip\)\)",
    ):
        GRPOTrainer(cfg, tmp_path / "run").setup()
