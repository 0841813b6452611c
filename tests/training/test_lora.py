"""LoRA through peft (`model.lora.enabled=true`): only the adapters train, the KL reference is the
base with the adapters off (no copy), checkpoints hold the adapter, and a resume is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from grpo_cli.models import AdaptersOff, load_policy
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics, reproducible
from tests.training.test_trainer import InterruptAt, run, small_config

PROMPT = torch.tensor([[257, 17, 11, 18, 29]])  # <s> (257) and four byte tokens of the tiny vocabulary


def lora_config(steps: int = 3, beta: float = 0.04, **train) -> TrainConfig:
    cfg = small_config(steps=steps, **train)
    cfg.model.lora.enabled = True
    cfg.algo.beta = beta
    cfg.optim.lr = 2e-2  # adapters start at zero: a full-model lr barely moves them in 3 steps
    return cfg


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


@torch.no_grad()
def logits(model, input_ids: torch.Tensor = PROMPT) -> torch.Tensor:
    return model(input_ids=input_ids).logits


def test_only_the_adapters_train_and_the_base_stays(tmp_path: Path) -> None:
    trainer = GRPOTrainer(lora_config(), tmp_path)
    trainer.setup()
    before = base_weights(trainer.model)
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    optimized = [p for group in trainer.learner.optimizer.param_groups for p in group["params"]]
    assert len(optimized) == len(trainable)  # the optimizer holds the adapters and nothing else
    lora_b = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert all(torch.count_nonzero(b) == 0 for b in lora_b.values())  # B = 0: the policy starts as the base
    for _ in range(3):
        assert trainer.step().metrics["optimizer_steps"] == 1
    after = base_weights(trainer.model)
    assert after.keys() == before.keys()
    assert all(torch.equal(before[name], after[name]) for name in before), "a base weight moved"
    moved = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and not torch.equal(p, lora_b[n])]
    assert moved, "no adapter moved in 3 steps"
    trainer.cleanup()


def test_the_reference_is_the_base_with_adapters_off(tmp_path: Path) -> None:
    trainer = GRPOTrainer(lora_config(), tmp_path)
    trainer.setup()
    reference = trainer.learner.reference
    assert isinstance(reference, AdaptersOff) and reference.policy is trainer.model  # no copy
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny_model", dtype=torch.float32).eval()
    first = trainer.step().metrics
    assert first["kl"] == 0.0  # the adapters start at zero: policy = reference before any update
    for _ in range(2):
        trainer.step()
    trainer.model.eval()
    policy_logits = logits(trainer.model)
    trainer.model.train()
    assert torch.equal(logits(trainer.learner.reference), logits(base))  # exactly the base, after 3 updates
    assert not torch.allclose(policy_logits, logits(base))  # while the policy has moved
    assert trainer.model.training  # the reference's eval mode was only for its call
    trainer.cleanup()


def test_a_lora_checkpoint_holds_the_adapter_and_loads_onto_its_base(tmp_path: Path) -> None:
    trainer = run(lora_config(steps=2, save_every=2), tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    files = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "trainer_state.json"} <= files
    assert "model.safetensors" not in files and "config.json" not in files  # no full weights
    with safe_open(checkpoint / "adapter_model.safetensors", "pt") as saved:
        assert saved.keys() and all("lora_A" in key or "lora_B" in key for key in saved.keys())
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["base_model"] == str((tmp_path / "tiny_model").resolve())
    assert state["config"]["model"]["lora"]["enabled"] is True

    cfg = lora_config(steps=2)
    model, _, base_dir = load_policy(cfg.model, tmp_path, 0, torch.device("cpu"), "fp32", weights_dir=checkpoint)
    assert base_dir == tmp_path / "tiny_model"
    model.eval()
    with safe_open(checkpoint / "adapter_model.safetensors", "pt") as saved:
        loaded = dict(model.named_parameters())
        for key in saved.keys():  # peft drops the adapter name on save: ...q_proj.lora_A.weight
            name = next(n for n in loaded if n.replace(".default", "") == key)
            assert torch.equal(loaded[name], saved.get_tensor(key))
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny_model", dtype=torch.float32).eval()
    assert not torch.allclose(logits(model), logits(base))  # base + the trained adapter, not the base alone
    assert len(trainer.history) == 2

    cfg.model.lora.enabled = False
    with pytest.raises(GrpoError, match="holds a LoRA adapter, but model.lora.enabled=False"):
        load_policy(cfg.model, tmp_path, 0, torch.device("cpu"), "fp32", weights_dir=checkpoint)


def test_an_interrupted_lora_run_resumes_exactly(tmp_path: Path) -> None:
    run(lora_config(steps=4), tmp_path / "straight")
    interrupted = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run(lora_config(steps=4), interrupted, InterruptAt(2))
    assert [p.name for p in (interrupted / "checkpoints").iterdir()] == ["step_000002"]
    run(lora_config(steps=4), interrupted)  # train.resume=auto: base + adapter, optimizer, RNG
    resumed, straight = read_metrics(interrupted), read_metrics(tmp_path / "straight")
    assert [row["step"] for row in resumed] == [1, 2, 3, 4]
    assert reproducible(resumed) == reproducible(straight)
    assert resumed[2]["kl"] > 0  # the resumed steps ran against the base, not the restored policy


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("r", 0, "model.lora.r=0: must be at least 1"),
        ("alpha", 0.0, "model.lora.alpha=0.0: must be > 0"),
        ("dropout", 1.0, r"model.lora.dropout=1.0: must be in \[0, 1\)"),
        ("target_modules", [], r"model.lora.target_modules=\[\]: must name at least one module"),
    ],
)
def test_lora_settings_are_validated(key: str, value: object, message: str) -> None:
    cfg = TrainConfig()
    setattr(cfg.model.lora, key, value)
    with pytest.raises(GrpoError, match=message):
        validate(cfg)


def test_target_modules_the_model_lacks_are_a_clear_error(tmp_path: Path) -> None:
    cfg = lora_config()
    cfg.model.lora.target_modules = ["query_key_value"]
    with pytest.raises(GrpoError, match=r"model.lora.target_modules=\['query_key_value'\]: .*not found"):
        GRPOTrainer(cfg, tmp_path).setup()
