"""The whole tool chain on files, through the functions the CLI calls: train -> export -> rollout ->
score -> eval, for a full and a LoRA run. Each stage reads only what the previous one wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.commands.eval import run_eval
from grpo_cli.commands.export import run_export
from grpo_cli.commands.rollout import run_rollout
from grpo_cli.commands.score import run_score
from grpo_cli.commands.train import run_train
from grpo_cli.config.schema import EvalConfig, ExportConfig, ModelConfig, RolloutRunConfig, ScoreConfig, TrainConfig
from grpo_cli.models import load_weights

G, PROMPTS = 4, 6


def trained(run_dir: Path, lora: bool) -> Path:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 3, 2, G
    cfg.algo.beta = 0.04
    cfg.monitor.console, cfg.monitor.plots = "quiet", False
    if lora:
        cfg.model.lora.enabled = True
        cfg.model.lora.target_modules = [*cfg.model.lora.target_modules, "lm_head"]
        cfg.optim.lr = 2e-2  # the adapters must move for the merge to matter
    run_train(cfg, run_dir)
    return run_dir / "checkpoints" / "step_000003"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_train_export_rollout_score_eval(tmp_path: Path, lora: bool) -> None:
    checkpoint = trained(tmp_path / "run", lora)
    exported = tmp_path / "exported"
    run_export(ExportConfig(checkpoint=str(tmp_path / "run"), output=str(exported)))  # the run's newest

    # Plain transformers reloads the export with the checkpoint's logits (base + adapter for LoRA).
    tokenizer = AutoTokenizer.from_pretrained(exported)
    ids = tokenizer(["3+4=", "9+9="], return_tensors="pt", padding=True)
    source = load_weights(checkpoint, tmp_path / "run" / "tiny_model", torch.float32).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(exported).eval()
    with torch.no_grad():
        difference = (source(**ids).logits - reloaded(**ids).logits).abs().max().item()
    print(f"max |logit difference| {difference:.2e}")
    assert difference < 1e-4, difference
    assert not (exported / "adapter_config.json").exists()  # merged: a plain model directory

    rollouts = tmp_path / "rollouts.jsonl"
    model = ModelConfig(kind="hf", path=str(exported))
    rollout_cfg = RolloutRunConfig(model=model, output=str(rollouts), max_prompts=PROMPTS)
    rollout_cfg.rollout.num_generations = G
    run_rollout(rollout_cfg, tmp_path / "rollout_run")
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(PROMPTS))
    assert all(len(r["completions"]) == G for r in records)

    scored = tmp_path / "scored.jsonl"
    run_score(ScoreConfig(input=str(rollouts), output=str(scored)))
    completions = [c for line in scored.read_text().splitlines() for c in json.loads(line)["completions"]]
    assert len(completions) == PROMPTS * G and all(c["rewards"]["exact_match"] is not None for c in completions)

    eval_cfg = EvalConfig(input=str(rollouts), output=str(tmp_path / "eval.json"))
    eval_cfg.rollout.num_generations, eval_cfg.eval.k = G, [1, 2]
    run_eval(eval_cfg, tmp_path / "eval_run")
    report = json.loads((tmp_path / "eval.json").read_text())
    # eval and score judge the same file alike: the default rewards are raw (normalize none)
    assert report["reward/mean"] == pytest.approx(sum(c["reward"] for c in completions) / len(completions))
    solved = [c["rewards"]["exact_match"] >= 1.0 for c in completions]
    assert report["accuracy"] == pytest.approx(sum(solved) / len(solved))
    assert report["accuracy"] <= report["pass@2"] <= 1
