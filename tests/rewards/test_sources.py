"""Start-up checks of reward sources against the data: what would fail every batch fails before
any model loads, naming the reward and what it cannot take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_a_reward_module_in_the_working_directory_imports_from_the_grpo_command(tmp_path) -> None:
    """Issue 21 item 18: the `grpo` console script, unlike `python -m`, has no working directory on
    sys.path, so `target: my_rewards:score` beside the user failed with "No module named". Both
    the in-process call and a spawned worker's (parallel: true) must find it."""
    (tmp_path / "my_rewards.py").write_text(
        "def score(prompts, completions, **_):\n    return [float(len(c)) for c in completions]\n"
    )
    row = {
        "prompt": "1+1=",
        "answer": "2",
        "completions": [{"text": "2", "token_count": 1}, {"text": "22", "token_count": 2}],
    }
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    functions = "[{name: here, target: 'my_rewards:score'}, {name: pooled, target: 'my_rewards:score', parallel: true}]"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("grpo")),
            "score",
            "input=in.jsonl",
            "output=out.jsonl",
            f"reward.functions={functions}",
            "reward.num_workers=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scored = json.loads((tmp_path / "out.jsonl").read_text())["completions"]
    assert [c["rewards"] for c in scored] == [{"here": 1.0, "pooled": 1.0}, {"here": 2.0, "pooled": 2.0}]
