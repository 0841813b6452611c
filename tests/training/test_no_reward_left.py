"""A run whose every reward function is masked stops (issue 21 item 6): it used to go on training on
nothing (every completion unscorable, every advantage 0) and exit 0."""

from __future__ import annotations

import pytest

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.rewards import NoRewardLeft
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics, run_grpo

BROKEN = "tests.rewards.pool_functions:flaky"  # raises on every batch


def test_the_trainer_stops_once_every_function_is_masked_and_saves_the_last_finished_step(tmp_path) -> None:
    cfg = TrainConfig()
    cfg.reward.functions = [RewardFunctionConfig(name="broken", target=BROKEN)]
    cfg.reward.max_consecutive_failures = 2
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 6, 2, 2
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    with pytest.raises(NoRewardLeft, match=r"every reward function is masked .*broken: ValueError: flaky") as err:
        trainer.train()
    trainer.cleanup()
    # step 1 failed once and trained on nothing; step 2's failure masks the last function: stop there
    assert len(trainer.history) == 1
    assert "step 1 is saved in" in str(err.value) and (tmp_path / "checkpoints" / "step_000001").is_dir()


def test_grpo_train_exits_non_zero_with_one_line_naming_the_masked_functions(tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = run_grpo(
        "train",
        f"reward.functions=[{{name: broken, target: '{BROKEN}'}}]",
        "reward.max_consecutive_failures=2",
        "train.steps=6",
        "train.prompts_per_step=2",
        "rollout.num_generations=2",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: every reward function is masked" in result.stderr and "Traceback" not in result.stderr
    assert len(read_metrics(run_dir)) == 1
