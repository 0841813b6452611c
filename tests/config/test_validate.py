"""`validate` refuses impossible values before any model is built; `check_key` catches typos."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.keys import check_key
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import (
    EvalConfig,
    RewardConfig,
    RewardFunctionConfig,
    RolloutRunConfig,
    ScoreConfig,
    TrainConfig,
)
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError


def valid_config(**overrides: Any) -> TrainConfig:
    """The schema defaults (the default run) with `overrides` set."""
    cfg = TrainConfig()
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
        ("rollout.min_new_tokens", -1),
        ("rollout.min_new_tokens", 5),  # above max_new_tokens (4)
        ("rollout.loop", "vllm"),
        ("rollout.backend", "sglang"),
        ("distributed.num_processes", 0),
        ("distributed.main_process_port", 70000),
        ("distributed.accelerate_config", "no/such/accelerate.yaml"),
        ("train.layout", "pack"),
        ("train.steps", 0),
        ("algo.loss_type", "ppo"),
        ("algo.scale_rewards", "std"),
        ("algo.kl_estimator", "k4"),
        ("data.on_long_prompt", "truncate"),
        ("data.on_long_prompt", "drop"),
        ("model.tiny.hidden_size", 63),  # not a multiple of the 4 heads: a traceback from torch before
        ("train.save_every", -1),  # step % -1 == 0: a checkpoint at every step (1.5 GB each on SmolLM2)
        ("train.eval_every", -1),  # likewise an eval at every step
        ("train.threads", -1),
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
        validate(TrainConfig(reward=RewardConfig(functions=[])))


@pytest.mark.parametrize("choice", ["truncate_left", "skip", "error"])
def test_on_long_prompt_choices_pass(choice: str) -> None:
    assert validate(valid_config(**{"data.on_long_prompt": choice})) == []


def test_on_long_prompt_typo_suggests_the_nearest() -> None:
    with pytest.raises(GrpoError, match=r"data.on_long_prompt='truncate_lef'.*did you mean truncate_left\?"):
        validate(valid_config(**{"data.on_long_prompt": "truncate_lef"}))


@pytest.mark.parametrize("normalize", [None, "none", "zscore", "sigmoid", "group_zscore"])
def test_normalize_unset_or_a_known_choice_passes(normalize: str | None) -> None:
    cfg = valid_config()
    cfg.reward.functions.append(RewardFunctionConfig(name="rm", model_path="/models/rm", normalize=normalize))
    assert validate(cfg) == []


def test_normalize_typo_names_the_function_index() -> None:
    cfg = valid_config()
    cfg.reward.functions[1].normalize = "zcore"
    with pytest.raises(GrpoError) as info:
        validate(cfg)
    assert "reward.functions[1].normalize='zcore'" in str(info.value)
    assert "did you mean zscore?" in str(info.value)


def test_normalize_is_unset_by_default() -> None:
    """None picks by kind when resolved (zscore for a reward model), so the schema must not choose."""
    assert RewardFunctionConfig(name="f").normalize is None


def test_fp16_with_autocast_is_refused() -> None:
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"precision.dtype": "fp16", "precision.autocast": True}))
    message = str(info.value)
    assert "precision.dtype=fp16" in message and "precision.autocast=true" in message
    assert "bf16" in message and "scaler" in message


@pytest.mark.parametrize(("dtype", "autocast"), [("fp16", False), ("bf16", True), ("bf16", False), ("fp32", False)])
def test_other_precision_combinations_pass(dtype: str, autocast: bool) -> None:
    assert validate(valid_config(**{"precision.dtype": dtype, "precision.autocast": autocast})) == []


def test_resume_allow_changes_is_off_by_default() -> None:
    assert TrainConfig().train.resume_allow_changes is False


def test_hf_model_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(GrpoError, match="model.path"):
        validate(valid_config(**{"model.kind": "hf", "model.path": None}))
    missing = tmp_path / "no_such_model"
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"model.kind": "hf", "model.path": str(missing)}))
    assert str(missing) in str(info.value)
    assert validate(valid_config(**{"model.kind": "hf", "model.path": str(tmp_path), "optim.lr": 1e-5})) == []


def test_a_pretrained_model_with_the_tiny_models_lr_is_warned(tmp_path: Path) -> None:
    """`model=smollm2_135m` logged "effective lr 0.002" and said nothing: 2e-3 is the tiny model's."""
    hf = {"model.kind": "hf", "model.path": str(tmp_path)}
    (warning,) = validate(valid_config(**hf))
    assert warning.startswith("optim.lr=0.002 is the tiny random-init model's default") and "set optim.lr" in warning
    assert validate(valid_config(**hf, **{"optim.lr": 1e-5})) == []
    assert validate(valid_config()) == []  # the tiny model's own lr


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


def test_a_directory_as_data_path_is_called_a_directory(tmp_path: Path) -> None:
    """It said "no such file" of a directory that is plainly there."""
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**{"data.kind": "jsonl", "data.path": str(tmp_path)}))
    assert str(info.value) == (f"data.path={tmp_path}: a directory; data=jsonl reads one file, a JSON object per line")


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


@pytest.mark.parametrize(
    ("key", "schema", "meant"),
    [
        ("seed", TrainConfig, "train.seed or data.seed"),  # eval's and rollout's `seed`; it said "sweep"
        ("threads", TrainConfig, "train.threads"),
        ("lr", TrainConfig, "optim.lr"),
        ("steps", TrainConfig, "train.steps or debug.steps"),
        ("seed", ScoreConfig, "data.seed"),
        ("hidden_size", EvalConfig, "model.tiny.hidden_size"),
    ],
)
def test_a_key_in_another_section_is_named_there(key: str, schema: type, meant: str) -> None:
    with pytest.raises(GrpoError) as info:
        check_key(key, schema)
    assert str(info.value) == f"unknown config key {key}; did you mean {meant}?"
    check_key("seed", EvalConfig)  # eval's own


def test_check_key_without_a_near_key_still_names_it() -> None:
    with pytest.raises(GrpoError) as info:
        check_key("zzzzzz.qqqqqq")
    assert "zzzzzz.qqqqqq" in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "reward.functions",
        "reward.functions.0.kwargs.threshold",
        "reward.functions.0.kwargs.nested.anything",  # kwargs: dict[str, Any], the function's own
        "reward.functions.2.name",
        "reward.functions.0.normalize",
        "curriculum.phases",
        "curriculum.phases.0.weights.exact_match",  # weights: dict[str, float], any function name
        "curriculum.phases.1.until",
        "data.operations.0",
        "data.on_long_prompt",
        "train.resume_allow_changes",
    ],
)
def test_check_key_walks_into_list_elements_and_dicts(key: str) -> None:
    check_key(key)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("reward.functions.0.wieght", "reward.functions.0.weight"),
        ("reward.functions.3.normalise", "reward.functions.3.normalize"),
        ("curriculum.phases.0.untill", "curriculum.phases.0.until"),
        ("reward.functions.exact_match.weight", "reward.functions.0.weight"),  # a name where an index goes
        ("data.on_long_promt", "data.on_long_prompt"),
        ("train.resume_allow_change", "train.resume_allow_changes"),
    ],
)
def test_check_key_refuses_typos_under_list_indices(typo: str, meant: str) -> None:
    with pytest.raises(GrpoError) as info:
        check_key(typo)
    assert f"unknown config key {typo}" in str(info.value)
    assert f"did you mean {meant}?" in str(info.value)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("reward.functions.first", "reward.functions takes a list index"),
        ("data.operations.0.x", "data.operations.0 is a value, not a section"),
        ("curriculum.phases.0.weights.a.b", "curriculum.phases.0.weights.a is a value, not a section"),
        ("optim.lr.x", "optim.lr is a value, not a section"),
    ],
)
def test_check_key_explains_a_wrong_shape(key: str, why: str) -> None:
    with pytest.raises(GrpoError, match=re.escape(why)):
        check_key(key)


@pytest.mark.parametrize(
    ("processes", "mini_batches", "refused"), [(2, 4, True), (2, 3, True), (2, 2, False), (1, 4, False)]
)
def test_mini_batches_are_checked_against_each_processs_share(processes: int, mini_batches: int, refused: bool) -> None:
    """4 prompts over 2 processes leave each 2 groups to split: 4 mini-batches used to pass here
    and fail in every process after its first rollout (issue 21 item 11)."""
    cfg = valid_config(**{"train.prompts_per_step": 4, "distributed.num_processes": processes})
    cfg.algo.mini_batches = mini_batches
    if not refused:
        assert validate(cfg) == []
        return
    with pytest.raises(GrpoError, match=r"algo.mini_batches=\d.*prompts_per_step=4 / distributed.num_processes=2 = 2"):
        validate(cfg)


@pytest.mark.parametrize(
    ("overrides", "key", "why"),
    [
        ({"algo.delta": 1.2}, "algo.delta", "must be > 1 + algo.epsilon_high"),
        ({"algo.delta": 3.0, "algo.clip_ratio_c": 3.0}, "algo.delta", "not both"),
        ({"algo.clip_ratio_c": 1.0}, "algo.clip_ratio_c", "must be > 1"),
        ({"algo.loss_type": "cispo"}, "algo.epsilon_high", "CISPO's cap on the importance weight"),
        (
            {"algo.loss_type": "cispo", "algo.epsilon_high": 5.0, "algo.delta": 7.0},
            "algo.delta",
            "which loss_type=cispo",
        ),
        ({"algo.loss_type": "sapo", "algo.clip_ratio_c": 3.0}, "algo.clip_ratio_c", "which loss_type=sapo has not"),
        ({"algo.sapo_temperature_neg": 0.0}, "algo.sapo_temperature_neg", "must be > 0"),
        ({"algo.loss_type": "vespo", "algo.delta": 3.0}, "algo.delta", "which loss_type=vespo has not"),
        ({"algo.loss_type": "vespo", "algo.ratio_level": "sequence"}, "algo.ratio_level", "set algo.ratio_level=token"),
        (
            {"algo.loss_type": "vespo", "algo.rollout_correction.mode": "sequence_mask"},
            "algo.rollout_correction.mode",
            "use token_truncate, token_mask or none",
        ),
        ({"algo.vespo.k_neg": -1.0}, "algo.vespo.k_neg", "must be >= 0"),
        ({"algo.vespo.lambda_pos": 0.0}, "algo.vespo.lambda_pos", "must be > 0"),
        (
            {"algo.rollout_correction.min": 2.0},
            "algo.rollout_correction.min",
            "must be in [0, algo.rollout_correction.cap=2.0)",
        ),
        ({"algo.rollout_correction.min": -0.1}, "algo.rollout_correction.min", "the weight's lower bound"),
        ({"algo.off_policy_mask_threshold": -0.5}, "algo.off_policy_mask_threshold", "must be >= 0"),
        ({"algo.adaptive_entropy.coef_delta": -0.01}, "algo.adaptive_entropy.coef_delta", "must be >= 0"),
        (
            {"algo.adaptive_entropy.coef_max": -1.0},
            "algo.adaptive_entropy.coef_max",
            "must be >= algo.adaptive_entropy.coef_min",
        ),
        ({"algo.adaptive_entropy.target": -1.0}, "algo.adaptive_entropy.target", "in nats"),
        (
            {"algo.adaptive_entropy.enabled": True, "algo.entropy_coef": 2.0},
            "algo.entropy_coef",
            "adaptive entropy's starting coefficient",
        ),
    ],
)
def test_loss_family_combinations_that_cannot_mean_anything_are_refused(
    overrides: dict[str, Any], key: str, why: str
) -> None:
    """Each refusal names the key a user set; delta and clip_ratio_c are one bound under two names
    (core.loss.dual_clip), so setting both would silently keep one of them."""
    with pytest.raises(GrpoError, match=re.escape(why)) as info:
        validate(valid_config(**overrides))
    assert f"{key}=" in str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"algo.delta": 3.0},
        {"algo.clip_ratio_c": 3.0},
        {"algo.loss_type": "cispo", "algo.epsilon_high": 5.0},
        {"algo.loss_type": "luspo", "algo.ratio_level": "sequence"},
        {"algo.loss_type": "vespo", "algo.rollout_correction.mode": "token_mask"},
        {"algo.rollout_correction.min": 0.5},
        {"algo.off_policy_mask_threshold": 0.0},
        {"algo.adaptive_entropy.enabled": True},  # entropy_coef 0: the coefficient starts at its floor
        {"algo.entropy_coef": 2.0},  # the adaptive bounds bind only while it is on
    ],
)
def test_each_loss_family_knob_alone_passes(overrides: dict[str, Any]) -> None:
    assert validate(valid_config(**overrides)) == []


def test_luspo_at_the_token_level_is_a_warning() -> None:
    """TRL warns too: LUSPO is a change to GSPO, whose importance ratio is the sequence's."""
    (warning,) = validate(valid_config(**{"algo.loss_type": "luspo"}))
    assert "algo.loss_type=luspo" in warning and "algo.ratio_level=token" in warning and "algo=luspo" in warning


@pytest.mark.parametrize("validate_command", [validate_eval, validate_rollout])
def test_eval_and_rollout_refuse_negative_threads(validate_command: Callable[[Any], None]) -> None:
    cfg = EvalConfig(threads=-1) if validate_command is validate_eval else RolloutRunConfig(threads=-1)
    with pytest.raises(GrpoError, match=r"^invalid value threads=-1: must be >= 0 \(torch CPU threads; 0: auto\)$"):
        validate_command(cfg)
