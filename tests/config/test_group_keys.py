"""A key that the chosen option of its group ignores is refused in one line naming the option that
reads it, from every command that samples (train, rollout, eval): `data.path=FILE` without
`data=jsonl` trained the arithmetic task, and `model.path=ORG/NAME` without `model=hf` trained the
random tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import EvalConfig, RolloutRunConfig, TinyModelConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from tests.config.test_validate import valid_config


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {"data.path": "prompts.jsonl"},
            "invalid value data.path='prompts.jsonl': read by data=jsonl or data=hf only, and this run's "
            "data=arithmetic (the synthetic a+b= problems) ignores it: add data=jsonl or data=hf, or drop data.path",
        ),
        (
            {"data.kind": "math", "data.path": "prompts.jsonl"},
            "invalid value data.path='prompts.jsonl': read by data=jsonl or data=hf only, and this run's data=math "
            "(the packaged word problems) ignores it: add data=jsonl or data=hf, or drop data.path",
        ),
        (
            {"model.path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
            "invalid value model.path='HuggingFaceTB/SmolLM2-135M-Instruct': read by model=hf only, and this "
            "run's model=tiny (a random-init model built in the run directory) ignores it: add model=hf, or drop "
            "model.path",
        ),
        ({"model.trust_remote_code": True}, "model.trust_remote_code=True: read by model=hf only"),
        ({"data.kind": "code", "data.prompt_field": "question"}, "data.prompt_field='question': read by data=jsonl"),
        ({"data.kind": "jsonl", "data.max_operand": 99}, "data.max_operand=99: read by data=arithmetic only"),
        ({"precision.autocast": True}, "read by precision=bf16 or precision=fp16 only, and this run's precision=fp32"),
        ({"precision.dtype": "bf16", "precision.autocast": True, "precision.grad_scaler": True}, "=fp16 only"),
        ({"curriculum.interpolate": "linear"}, "read by curriculum=three_phase or curriculum=phased only"),
    ],
)
def test_a_key_the_chosen_option_ignores_is_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(GrpoError) as info:
        validate(valid_config(**settings))
    assert says in str(info.value)


def test_the_tiny_size_under_model_hf_names_model_tiny(tmp_path: Path) -> None:
    cfg = valid_config(**{"model.kind": "hf", "model.path": str(tmp_path), "optim.lr": 1e-5})
    cfg.model.tiny = TinyModelConfig(hidden_size=128)
    with pytest.raises(GrpoError, match=r"^invalid value model\.tiny=\{'hidden_size': 128, .*read by model=tiny only"):
        validate(cfg)
    cfg.model.tiny = TinyModelConfig()
    assert validate(cfg) == []


def test_the_keys_the_chosen_option_reads_pass(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    jsonl = {"data.kind": "jsonl", "data.path": str(data), "data.prompt_field": "question"}
    assert validate(valid_config(**jsonl)) == []
    assert validate(valid_config(**{"data.max_operand": 99, "data.operations": ["+", "*"]})) == []
    assert validate(valid_config(**{"precision.dtype": "bf16", "precision.autocast": True})) == []
    fp16 = {"precision.dtype": "fp16", "precision.autocast": True, "precision.grad_scaler": True}
    assert validate(valid_config(**fp16)) == []


def test_rollout_and_eval_refuse_them_too() -> None:
    """They share conf/model and conf/data, and the check (config/generation_checks.py)."""
    rollout = RolloutRunConfig()
    rollout.data.path = "prompts.jsonl"
    with pytest.raises(GrpoError, match=r"data\.path='prompts\.jsonl': read by data=jsonl or data=hf only"):
        validate_rollout(rollout)
    evaluation = EvalConfig()
    evaluation.model.path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(GrpoError, match=r"model\.path='HuggingFaceTB/SmolLM2-135M-Instruct': read by model=hf only"):
        validate_eval(evaluation)
    evaluation.input = "rollouts.jsonl"  # scoring a file loads no model: nothing to refuse
    validate_eval(evaluation)


def test_the_default_run_sets_no_ignored_key() -> None:
    assert validate(TrainConfig()) == []
