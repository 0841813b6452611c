"""An environment's failures are the environment's: rows it failed are out of the step whatever a
reward function makes of their text, they never count against a reward function, and an
environment that fails every row for `reward.max_consecutive_failures` steps stops the run with a
line that names it (reset and get_reward alike). Through the real trainer on the tiny model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups, score_rollout

BROKEN = "tests.environments.broken"


def env_config(name: str, target: str, steps: int = 3) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 2, 4
    cfg.env.name, cfg.env.target, cfg.env.max_turns = name, f"{BROKEN}:{target}", 2
    cfg.data.chat, cfg.data.max_prompt_tokens = name == "trl", 200
    cfg.reward.max_consecutive_failures = 2
    return cfg


@pytest.mark.parametrize(
    ("target", "call", "dynamic"),
    [("ResetFails", "reset", False), ("RewardFails", "reward", False), ("ResetFails", "reset", True)],
    ids=["reset", "reward", "reset-dynamic-sampling"],  # dynamic sampling rebuilds the step's scores
)
def test_an_environment_failing_every_row_stops_the_run_naming_it_not_the_reward_functions(
    tmp_path: Path, target: str, call: str, dynamic: bool
) -> None:
    cfg = env_config("trl", target, steps=4)
    cfg.algo.dynamic_sampling.enabled, cfg.algo.dynamic_sampling.max_draws = dynamic, 1
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    alerts: list[str] = []
    trainer.observers.append(type("Alerts", (), {"on_step": lambda self, r: alerts.extend(r.alerts)})())
    try:
        with pytest.raises(GrpoError) as stopped:
            trainer.train()
        masked = list(trainer.reward_fusion.masked)
    finally:
        trainer.cleanup()
    message = str(stopped.value)
    assert f"{call}: RuntimeError" in message and "the environment" in message
    assert "reward.max_consecutive_failures=2" in message and "step 1 is saved" in message
    assert "exact_match" not in message and "partial_credit" not in message
    assert masked == []  # the reward functions never failed: nothing of theirs is masked
    assert any("the environment failed on 8 of 8 rows" in line for line in alerts)
    assert not [line for line in alerts if "exact_match" in line or "partial_credit" in line], alerts


def test_rows_the_environment_failed_are_out_of_the_step_and_the_others_are_scored(tmp_path: Path) -> None:
    cfg = env_config("custom", "EveryOtherResetFails")
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    try:
        batch = trainer.sampler.next_batch(cfg.train.prompts_per_step)
        rollout = generate_groups(batch, trainer.encoder, trainer.generator, cfg.rollout.num_generations)
        fusion = score_rollout(batch, rollout, trainer.reward_executor, trainer.reward_fusion)
    finally:
        trainer.cleanup()
    errors = rollout.env_columns["env_error"]
    failed = [i for i, why in enumerate(errors) if why is not None]
    assert len(failed) == 4 and all("reset: RuntimeError: no board for this row" in errors[i] for i in failed)
    kept = [i for i in range(8) if i not in failed]
    # partial_credit scores any text: only the environment's failure keeps it off those rows
    assert all(math.isnan(fusion.per_function["partial_credit"][i]) for i in failed)
    assert all(math.isfinite(fusion.per_function["partial_credit"][i]) for i in kept)
    assert all(math.isnan(fusion.fused[i]) for i in failed) and all(math.isfinite(fusion.fused[i]) for i in kept)
    assert fusion.alerts == []  # no reward function is blamed for the environment's rows
