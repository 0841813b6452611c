"""Values a new user set that used to end in a traceback, a wrong message or a silently wrong run
(issue 52), refused by the same checks `grpo train`, `grpo rollout` and `grpo eval` run first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import DataConfig, EvalConfig, RolloutRunConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from tests.config.test_validate import valid_config

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "key", ["num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"]
)
def test_a_tiny_model_without_a_layer_or_a_width_is_one_line(key: str) -> None:
    # num_layers=0 was an IndexError from inside transformers once the model ran
    with pytest.raises(GrpoError, match=rf"^invalid value model\.tiny\.{key}=0: must be at least 1$"):
        validate(valid_config(**{f"model.tiny.{key}": 0}))


def test_threads_above_the_cores_are_refused_naming_the_cores() -> None:
    # 1000 threads on this machine's cores ran 100x slower, without a word
    says = rf"^invalid value train\.threads=1000: more than the {CORES} CPU core\(s\) this process may use"
    with pytest.raises(GrpoError, match=says):
        validate(valid_config(**{"train.threads": 1000}))
    with pytest.raises(GrpoError, match=r"^invalid value threads=1000: more than the"):
        validate_rollout(RolloutRunConfig(threads=1000))
    with pytest.raises(GrpoError, match=r"^invalid value threads=1000: more than the"):
        validate_eval(EvalConfig(threads=1000))
    assert validate(valid_config(**{"train.threads": CORES})) == []


def test_a_prompt_budget_of_no_tokens_is_refused() -> None:
    # max_prompt_tokens=0 trained on empty prompts: every prompt cut to nothing from the left
    for value in (0, -5):
        with pytest.raises(GrpoError, match=rf"^invalid value data\.max_prompt_tokens={value}: must be at least 1"):
            validate(valid_config(**{"data.max_prompt_tokens": value}))
    with pytest.raises(GrpoError, match=r"^invalid value data\.max_prompt_tokens=0"):
        validate_rollout(RolloutRunConfig(data=DataConfig(max_prompt_tokens=0)))


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_a_data_path_that_exists_but_is_no_file_is_not_called_missing(tmp_path: Path) -> None:
    with pytest.raises(GrpoError, match=r"^data\.path=/dev/null: not a regular file \(a device"):
        validate(valid_config(**{"data.kind": "jsonl", "data.path": "/dev/null"}))
    with pytest.raises(GrpoError, match=rf"^data\.path={tmp_path / 'gone.jsonl'}: no such file$"):
        validate(valid_config(**{"data.kind": "jsonl", "data.path": str(tmp_path / "gone.jsonl")}))
