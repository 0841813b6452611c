"""`model.lm_head_fp32` (issue 24, ScaleRL): in a bf16 run the output projection and so the logits
are computed in fp32, from weights that keep their dtype, names and tying; on the real tiny model
loaded through load_policy, and through the trainer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import ModelConfig, PrecisionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import Float32Head, fp32_lm_head, load_policy
from grpo_cli.training import GRPOTrainer


def loaded(tiny_model_dir: Path, tmp_path: Path, fp32_head: bool):
    cfg = ModelConfig(kind="hf", path=str(tiny_model_dir), lm_head_fp32=fp32_head)
    model, _, _ = load_policy(cfg, tmp_path, 0, torch.device("cpu"), "bf16")
    return model


def test_the_head_computes_in_fp32_from_bf16_weights_with_names_and_tying_kept(tiny_model_dir, tmp_path) -> None:
    plain, fp32 = loaded(tiny_model_dir, tmp_path, False), loaded(tiny_model_dir, tmp_path, True)
    head = fp32.get_output_embeddings()
    assert isinstance(head, Float32Head) and head.weight.dtype == torch.bfloat16
    assert head.weight is fp32.get_input_embeddings().weight  # the tiny model ties them: still tied
    assert list(fp32.state_dict()) == list(plain.state_dict())  # checkpoints are unchanged
    ids = torch.tensor([[16, 17, 10, 22, 28, 40, 41]])
    assert plain(input_ids=ids).logits.dtype == torch.bfloat16
    got = fp32(input_ids=ids).logits
    assert got.dtype == torch.float32
    # the same bf16 weights and hidden states, only the last projection in fp32
    exact = fp32.model(input_ids=ids).last_hidden_state.float() @ head.weight.float().T
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-6)
    rounding = (plain(input_ids=ids).logits.float() - exact).abs().max().item()
    assert rounding > 1e-4  # what the fp32 head removes: bf16's rounding of the logits


def test_a_bf16_run_with_the_fp32_head_trains(tmp_path) -> None:
    cfg = TrainConfig(precision=PrecisionConfig(dtype="bf16", autocast=False))
    cfg.model.lm_head_fp32 = True
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.data.num_examples = 2, 4, 4, 50
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    assert isinstance(trainer.model.get_output_embeddings(), Float32Head)
    rows = [trainer.step().metrics for _ in range(2)]
    trainer.cleanup()
    assert all(row["optimizer_steps"] == 1 and math.isfinite(row["loss"]) for row in rows)


def test_a_head_that_is_not_a_linear_layer_is_refused(tiny_model_dir, tmp_path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.set_output_embeddings(torch.nn.Sequential(model.get_output_embeddings()))
    with pytest.raises(
        GrpoError, match="lm_head_fp32=true needs a plain Linear output layer; this model's is Sequential"
    ):
        fp32_lm_head(model)
