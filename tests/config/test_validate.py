"""`validate` refuses impossible values before any model is built; `check_key` catches typos."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_cli.config.schema import RewardConfig, RewardFunctionConfig, TrainConfig
from grpo_cli.config.validate import check_key, validate
from grpo_cli.errors import GrpoError


def valid_config(**overrides: Any) -> TrainConfig:
    """The schema defaults plus one reward (the schema leaves reward.functions empty)."""
    cfg = TrainConfig(
        reward=RewardConfig(functions=[RewardFunctionConfig(name="exact_match", target="exact_match")])
    )
    for key, value in overrides.items():
        set_key(cfg, key, value)
    return cfg


def set_key(cfg: TrainConfig, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = cfg
    for name in parents:
        node = getattr(node, name)
    assert hasattr(node, leaf), dotted
    setattr(node, leaf, value)


def test_the_valid_base_passes_without_warnings() -> None:
    assert validate(valid_config()) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rollout.num_generations", 1),
        ("rollout.num_generations", 0),
        ("rollout.num_generations", -4),
        ("optim.lr", 0.0),
        ("optim.lr", -0.0003),
        ("algo.epsilon_low", 0.0),
        ("algo.epsilon_low", -0.2),
        ("algo.epsilon_high", 0.0),
        ("algo.epsilon_high", -0.28),
        ("train.prompts_per_step", 0),
        ("train.prompts_per_step", -1),
        ("rollout.max_new_tokens", 0),
        ("rollout.max_new_tokens", -8),
        ("train.steps", 0),
        ("algo.loss_type", "ppo"),
        ("algo.scale_rewards", "std"),
        ("algo.kl_estimator", "k4"),
    ],
)
def test_impossible_values_name_key_and_value(key: str, value: Any) -> None:
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{key: value}))
    message = str(info.value)
    assert key in message
    assert str(value) in message


@pytest.mark.parametrize(
    ("typo", "meant"), [("dapoo", "dapo"), ("grop", "grpo"), ("dr-grpo", "dr_grpo"), ("bnpoo", "bnpo")]
)
def test_unknown_loss_type_suggests_the_nearest(typo: str, meant: str) -> None:
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"algo.loss_type": typo}))
    message = str(info.value)
    assert "algo.loss_type" in message and typo in message
    assert f"did you mean {meant}" in message


@pytest.mark.parametrize("g", [2, 3, 65, 128])
def test_num_generations_outside_4_to_64_is_a_warning(g: int) -> None:
    warnings = validate(valid_config(**{"rollout.num_generations": g}))
    assert len(warnings) == 1
    assert f"rollout.num_generations={g}" in warnings[0]


@pytest.mark.parametrize("g", [4, 8, 16, 64])
def test_num_generations_inside_4_to_64_is_silent(g: int) -> None:
    assert validate(valid_config(**{"rollout.num_generations": g})) == []


def test_no_reward_function_is_an_error() -> None:
    with pytest.raises(GrpoError, match="reward.functions"):
        validate(TrainConfig())


def test_hf_model_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(GrpoError, match="model.path"):
        validate(valid_config(**{"model.kind": "hf", "model.path": None}))
    missing = tmp_path / "no_such_model"
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"model.kind": "hf", "model.path": str(missing)}))
    assert str(missing) in str(info.value)
    assert validate(valid_config(**{"model.kind": "hf", "model.path": str(tmp_path)})) == []


def test_jsonl_data_needs_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(GrpoError, match="data.path"):
        validate(valid_config(**{"data.kind": "jsonl", "data.path": None}))
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"data.kind": "jsonl", "data.path": str(missing)}))
    assert str(missing) in str(info.value)
    present = tmp_path / "p.jsonl"
    present.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert validate(valid_config(**{"data.kind": "jsonl", "data.path": str(present)})) == []


# ---- check_key --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    ["optim", "optim.lr", "algo.beta", "rollout.num_generations", "model.tiny.hidden_size", "train.steps"],
)
def test_check_key_accepts_schema_keys(key: str) -> None:
    check_key(key)
    check_key(key, TrainConfig)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("optim.lrr", "optim.lr"),
        ("algo.betta", "algo.beta"),
        ("train.stepz", "train.steps"),
        ("rollout.num_generation", "rollout.num_generations"),
        ("model.tiny.hiden_size", "model.tiny.hidden_size"),
        ("optm.lr", "optim.lr"),
    ],
)
def test_check_key_suggests_the_nearest_key(typo: str, meant: str) -> None:
    with pytest.raises(GrpoError) as info:
        check_key(typo)
    message = str(info.value)
    assert typo in message
    assert f"did you mean {meant}?" in message


def test_check_key_without_a_near_key_still_names_it() -> None:
    with pytest.raises(GrpoError) as info:
        check_key("zzzzzz.qqqqqq")
    assert "zzzzzz.qqqqqq" in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "reward.functions",
        "reward.functions.0.kwargs.threshold",
        "reward.functions.2.name",
        "curriculum.phases",
        "curriculum.phases.0.weights.exact_match",
        "curriculum.phases.1.until",
        "data.operations.0",
    ],
)
def test_check_key_accepts_free_form_keys_under_dict_and_list_fields(key: str) -> None:
    check_key(key)
