"""Start-up checks of reward sources against the data: what would fail every batch fails before
any model loads, naming the reward and what it cannot take."""

from __future__ import annotations

import pytest

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.training import GRPOTrainer


def config(*functions: RewardFunctionConfig) -> TrainConfig:
    cfg = TrainConfig()  # the default arithmetic data: prompt, answer, a, op, b
    cfg.reward.functions = list(functions)
    return cfg


def test_a_reward_that_cannot_take_the_data_columns_fails_at_start_up(tmp_path) -> None:
    """Issue 21 item 5: `f(prompts, completions, answer)` has no **kwargs, so every batch's call
    (with a, op, b and completion_lengths too) raised TypeError; the start-up check passed it."""
    trainer = GRPOTrainer(
        config(RewardFunctionConfig(name="strict", target="tests.rewards.pool_functions:answer_only")), tmp_path
    )
    unexpected = r"\(got an unexpected keyword argument '(a|b|op|completion_lengths)'\)"
    with pytest.raises(GrpoError, match=r"reward 'strict' cannot take what every batch passes it " + unexpected) as err:
        trainer.setup()
    assert "add **kwargs" in str(err.value) and not hasattr(trainer, "model")  # before any model loads


def test_a_reward_needing_a_column_the_data_lacks_fails_at_start_up(tmp_path) -> None:
    trainer = GRPOTrainer(
        config(RewardFunctionConfig(name="sol", target="tests.rewards.pool_functions:needs_solution")), tmp_path
    )
    with pytest.raises(GrpoError, match=r"reward 'sol' needs \['solution'\]"):
        trainer.setup()


def test_a_reward_reading_completion_lengths_as_a_named_parameter_is_accepted(tmp_path) -> None:
    """`completion_lengths` reaches every reward: a parameter without a default for it is no missing column."""
    overlong = RewardFunctionConfig(name="long", target="tests.rewards.pool_functions:lengths_only")
    trainer = GRPOTrainer(config(overlong), tmp_path)
    trainer.cfg.train.steps = 1
    trainer.setup()
    assert [s.name for s in trainer.reward_sources] == ["long"]
    trainer.cleanup()
