"""The real model through the real engine: SmolLM2-135M-Instruct (30 layers, tied LM head, head
size 64) samples from the weights being trained, in a generator and in a `grpo train` run."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import make_generator
from tests.conftest import REPO, read_metrics, run_grpo
from tests.vllm.test_engine import STALE, engine_gap, moved, rollout_config

SMOLLM2_FLOOR = 1e-4  # fp32 engine against fp32 transformers on SmolLM2: 1e-5 measured (30 layers of rounding)


def test_smollm2_engine_follows_a_push_through_its_tied_lm_head(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(smollm2_dir)
    policy = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    encoded = tokenizer(["What is 12 + 7?", "Name a colour.", "2, 4, 6,"], padding=True, return_tensors="pt")
    generator, _ = make_generator(policy, tokenizer, rollout_config(), max_prompt_tokens=32)
    try:
        assert engine_gap(generator, policy, encoded) < SMOLLM2_FLOOR
        moved(policy)  # the embedding is the LM head too: a stale packed head would show here
        assert engine_gap(generator, policy, encoded) > STALE
        generator.weights_updated()
        assert engine_gap(generator, policy, encoded) < SMOLLM2_FLOOR
    finally:
        generator.close()


def test_grpo_train_with_the_vllm_backend_logs_the_gap_at_the_floor(smollm2_cache: Path, tmp_path: Path) -> None:
    """The recipe as a user runs it, 3 steps with the engine: each step's rollout/engine_gap at
    the floor and no engine-gap alert, so the run is on-policy."""
    run_dir = tmp_path / "run"
    proc = run_grpo(
        "train", "--config-dir", str(REPO / "recipes"), "-cn", "smollm2_135m_addition",
        f"model.cache_dir={smollm2_cache}", "rollout.backend=vllm", "rollout.vllm.dtype=fp32",
        "train.steps=3", "train.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=16",
        "optim.warmup_steps=0", "monitor.plots=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout loop: vllm (colocated, engine core in a child process" in proc.stdout + proc.stderr
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert 0 < row["rollout/engine_gap"] < SMOLLM2_FLOOR, row["step"]
    assert rows[-1]["kl"] > 0  # the policy moved away from the reference: the pushes carried updates
    assert "engine_gap" not in (run_dir / "train.log").read_text()  # no alert
