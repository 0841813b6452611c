"""LoRA on every family of the zoo (issue 53 item 4): the default `model.lora.target_modules`
([all-linear]) puts adapters on each family's projections, whatever it names them (q_proj, a fused
qkv_proj, MLA's q_a_proj, a linear-attention in_proj_qkv, a Mamba in_proj), and two steps of the
real trainer move every adapter off zero; the memory plan counts the adapters the trainer builds;
an explicit list keeps meaning what it says, and a name the model lacks is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import LoraConfig
from grpo_cli.errors import GrpoError
from grpo_cli.lora import add_lora
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.model_shape import model_config, model_shape
from grpo_cli.training.sharding import decoder_layers
from tests.zoo.conftest import smoke_sized
from tests.zoo.families import FAMILIES, Family

# The first projection of each family's attention or sequence mixer: a block holding one trains it
MIXER_INPUTS = {"q_proj", "qkv_proj", "q_a_proj", "in_proj_qkv", "in_proj_qkvz", "in_proj"}


def adapters(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name -> peft LoRA layer, for every module that got an adapter."""
    return {name: m for name, m in model.named_modules() if hasattr(m, "lora_B") and len(m.lora_B)}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_default_adapters_train_every_block_and_the_plan_counts_them(
    family: Family, zoo_dirs: dict[str, Path], tmp_path: Path
) -> None:
    cfg = smoke_sized(zoo_dirs[family.name])
    cfg.model.lora.enabled = True
    assert cfg.model.lora.target_modules == ["all-linear"]  # conf/model/hf.yaml's default
    trainer = GRPOTrainer(cfg, tmp_path)
    try:
        trainer.setup()
        layers = adapters(trainer.model)
        before = {name: layer.lora_B["default"].weight.detach().clone() for name, layer in layers.items()}
        assert all(torch.count_nonzero(b) == 0 for b in before.values())  # B = 0: the policy starts as the base
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        for _ in range(2):
            assert trainer.step().metrics["optimizer_steps"] == 1
        still = [n for n, layer in layers.items() if torch.equal(layer.lora_B["default"].weight, before[n])]
        assert not still, f"{family.name}: adapters that two steps left at zero: {still}"
        blocks = decoder_layers(trainer.model)
        mixers = 0
        for block in blocks:
            inside = {id(m) for m in block.modules()}
            assert any(id(layer) in inside for layer in layers.values()), f"{family.name}: a block without adapters"
            for name, module in block.named_modules():
                if name.rsplit(".", 1)[-1] in MIXER_INPUTS:
                    assert hasattr(module, "lora_B"), f"{family.name}: {type(block).__name__}.{name} has no adapter"
                    mixers += 1
        assert mixers >= len(blocks) // 2, f"{family.name}: attention or mixer projections not found"
    finally:
        trainer.cleanup()
    assert model_shape(model_config(cfg.model)).lora_parameters(cfg.model.lora) == trainable  # the memory plan's count


MLP = ("gate", "up", "down")
# The linear layers all-linear leaves out besides the head (every other one gets an adapter), and why
LEFT_OUT = {
    "llama4_text": ["layers.0.feed_forward.router", "layers.1.feed_forward.router"],  # returns a tuple
    "nemotron_h": ["layers.0.mixer.out_proj"],  # Mamba's fused kernel reads out_proj.weight itself
    "falcon_h1": ["layers.0.mamba.out_proj", "layers.1.mamba.out_proj"],
    "granitemoehybrid": ["layers.0.mamba.out_proj"],
    # peft's transformers-v5 conversion would move these onto the routed experts (peft#3711)
    "deepseek_v3": [f"layers.{i}.mlp.{p}{m}_proj" for i, p in ((0, ""), (1, "shared_experts.")) for m in MLP],
    "qwen3_next": [f"layers.{i}.mlp.shared_expert.{m}_proj" for i in (0, 1) for m in MLP],
    "qwen3_5_text": [],  # its gated delta net calls its out_proj: adapted
}


@pytest.mark.parametrize("family", sorted(LEFT_OUT))
def test_all_linear_leaves_out_only_what_an_adapter_cannot_ride(family: str, zoo_dirs: dict[str, Path]) -> None:
    base = AutoModelForCausalLM.from_pretrained(zoo_dirs[family])
    linear = {name for name, m in base.named_modules() if isinstance(m, torch.nn.Linear)}
    adapted = {name.removeprefix("base_model.model.") for name in adapters(add_lora(base, LoraConfig(enabled=True)))}
    assert sorted(linear - adapted) == sorted(["lm_head", *(f"model.{name}" for name in LEFT_OUT[family])])


@pytest.fixture(scope="module")
def qwen3_5(zoo_dirs: dict[str, Path]) -> Path:
    return zoo_dirs["qwen3_5_text"]


def test_an_explicit_list_adapts_those_modules_only(qwen3_5: Path) -> None:
    lora = LoraConfig(enabled=True, r=4, target_modules=["in_proj_qkv", "out_proj"])
    model = add_lora(AutoModelForCausalLM.from_pretrained(qwen3_5), lora)
    assert sorted(adapters(model)) == [
        "base_model.model.model.layers.0.linear_attn.in_proj_qkv",
        "base_model.model.model.layers.0.linear_attn.out_proj",
    ]


def test_all_linear_mixes_with_named_modules(qwen3_5: Path) -> None:
    """[all-linear, lm_head]: every linear layer, and the output head too (which all-linear leaves out)."""
    base = AutoModelForCausalLM.from_pretrained(qwen3_5)
    default = set(adapters(add_lora(base, LoraConfig(enabled=True, r=4))))
    with_head = set(adapters(add_lora(AutoModelForCausalLM.from_pretrained(qwen3_5), LoraConfig(
        enabled=True, r=4, target_modules=["all-linear", "lm_head"]))))  # fmt: skip
    assert with_head - default == {"base_model.model.lm_head"}


@pytest.mark.parametrize("targets", [["query_key_value"], ["all-linear", "qkv"]])
def test_a_name_the_model_lacks_is_a_one_line_error(qwen3_5: Path, targets: list[str]) -> None:
    missing = [t for t in targets if t != "all-linear"]
    with pytest.raises(GrpoError) as raised:
        add_lora(AutoModelForCausalLM.from_pretrained(qwen3_5), LoraConfig(enabled=True, target_modules=targets))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"model.lora.target_modules={targets}: {missing} not found in Qwen3_5ForCausalLM")
    assert "in_proj_qkv" in message and "[all-linear]" in message  # what the model has, and the default
