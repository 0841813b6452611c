"""The memory plan (`grpo train plan=true`): each part follows from the config the way a user sizes a
run by, checked against real models (the built tiny model, a peft-wrapped one), and `plan=true`
prints the plan without loading a weight or writing a checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import EnvConfig, TrainConfig
from grpo_cli.lora import add_lora
from grpo_cli.training.memory_plan import MemoryPlan, Part, free_memory, plan_memory
from tests.conftest import run_grpo

CPU = torch.device("cpu")
GIB = 2**30


def plan(cfg: TrainConfig, free: int | None = None) -> MemoryPlan:
    return plan_memory(cfg, CPU, free)


def part(p: MemoryPlan, name: str) -> Part:
    return next(x for x in p.parts if x.name == name)


def parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


@pytest.fixture(scope="module")
def tiny_parameters(tiny_model_dir: Path) -> int:
    return parameters(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


@pytest.mark.parametrize(("dtype", "itemsize"), [("auto", 4), ("bf16", 2)])
def test_weights_are_the_built_models_parameters_times_the_dtype(
    tiny_model_dir: Path, tiny_parameters: int, dtype: str, itemsize: int
) -> None:
    from_sizes = TrainConfig()  # model.tiny.*: the config the loader would build, no directory yet
    from_sizes.model.dtype = dtype
    from_directory = TrainConfig()
    from_directory.model.path, from_directory.model.dtype = str(tiny_model_dir), dtype
    for cfg in (from_sizes, from_directory):
        assert part(plan(cfg), "weights").bytes == tiny_parameters * itemsize


def test_precision_decides_the_weights_dtype_as_the_loader_does(tiny_parameters: int) -> None:
    cfg = TrainConfig()
    cfg.precision.dtype, cfg.precision.autocast = "bf16", True  # autocast keeps fp32 master weights
    assert part(plan(cfg), "weights").bytes == tiny_parameters * 4
    cfg.precision.autocast = False  # weights loaded in bf16 themselves
    assert part(plan(cfg), "weights").bytes == tiny_parameters * 2


def test_no_reference_at_beta_0_a_full_copy_above_it_and_none_extra_with_lora() -> None:
    cfg = TrainConfig()
    cfg.algo.beta = 0.0
    assert part(plan(cfg), "reference model").bytes == 0
    cfg.algo.beta = 0.04
    full = plan(cfg)
    assert part(full, "reference model").bytes == part(full, "weights").bytes
    cfg.model.lora.enabled = True
    assert part(plan(cfg), "reference model").bytes == 0  # the base with the adapters off


def test_a_pipelined_sampler_holds_its_own_weights_and_samples_beside_the_update() -> None:
    """rollout.max_staleness >= 1: the sampler's copy of the weights is resident, and its KV cache is
    held while the update runs: the peak adds the two instead of taking the larger."""
    cfg = TrainConfig()
    sync = plan(cfg)
    cfg.rollout.max_staleness = 1
    pipelined = plan(cfg)
    assert part(pipelined, "sampler's copy").bytes == part(pipelined, "weights").bytes
    cache = part(pipelined, "KV cache + sampling")
    assert cache.when == "resident" and cache.bytes == part(sync, "KV cache + sampling").bytes
    assert pipelined.phases["generation"] == 0
    extra = part(pipelined, "weights").bytes + cache.bytes
    grew = pipelined.peak - sync.peak
    assert extra - sync.phases["generation"] <= grew <= extra + cache.bytes  # the CPU slack follows the phases


def test_a_vllm_server_holds_its_engine_elsewhere_and_here_only_the_pushed_weights() -> None:
    cfg = TrainConfig()
    cfg.rollout.backend = "vllm"
    colocated = plan(cfg)
    assert part(colocated, "vLLM engine").bytes >= cfg.rollout.vllm.cpu_kv_cache_gib * GIB
    cfg.rollout.vllm.mode = "server"
    served = plan(cfg)
    assert not any(p.name == "vLLM engine" for p in served.parts)
    assert part(served, "vLLM weights file").bytes == part(served, "weights").bytes
    assert served.peak < colocated.peak - GIB // 2


@pytest.mark.parametrize(
    "targets",
    [["all-linear"], ["all-linear", "lm_head"], ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "down_proj"]],
)
def test_lora_gradients_and_optimizer_count_only_the_adapters(tiny_model_dir: Path, targets: list[str]) -> None:
    cfg = TrainConfig()
    cfg.model.path = str(tiny_model_dir)
    cfg.model.lora.enabled, cfg.model.lora.r, cfg.model.lora.target_modules = True, 8, targets
    wrapped = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg.model.lora)
    trainable = parameters(wrapped, trainable_only=True)
    assert 0 < trainable < parameters(wrapped) // 2
    p = plan(cfg)
    assert part(p, "gradients").bytes == trainable * 4
    assert part(p, "optimizer state").bytes == 2 * trainable * 4  # AdamW's two moments
    cfg.model.lora.enabled = False
    full = plan(cfg)
    assert part(full, "gradients").bytes == part(full, "weights").bytes  # every parameter, fp32


def test_an_fp32_head_makes_a_bf16_runs_logits_those_of_an_fp32_run() -> None:
    cfg = TrainConfig()
    fp32 = part(plan(cfg), "logits").bytes
    cfg.precision.dtype, cfg.precision.autocast = "bf16", True
    bf16 = part(plan(cfg), "logits").bytes
    cfg.model.lm_head_fp32 = True  # the last projection and its logits in fp32, the rest in bf16
    assert bf16 < part(plan(cfg), "logits").bytes == fp32


def test_gradient_checkpointing_and_accumulation_lower_the_activations() -> None:
    cfg = TrainConfig()
    cfg.model.tiny.num_layers = 8
    plain = part(plan(cfg), "activations").bytes
    cfg.model.gradient_checkpointing = True
    checkpointed = part(plan(cfg), "activations").bytes
    assert checkpointed < plain / 2
    cfg.model.gradient_checkpointing, cfg.train.grad_accum_steps = False, 4
    assert part(plan(cfg), "activations").bytes < plain / 2


def test_kv_cache_grows_with_the_generations_and_data_parallelism_shares_the_prompts() -> None:
    cfg = TrainConfig()
    kv = part(plan(cfg), "KV cache + sampling").bytes
    cfg.rollout.num_generations *= 2
    assert part(plan(cfg), "KV cache + sampling").bytes == 2 * kv
    cfg.distributed.num_processes = 2  # per process: half the prompts
    assert part(plan(cfg), "KV cache + sampling").bytes == kv


def test_a_multi_turn_plan_counts_every_turn_and_answer_of_a_trajectory() -> None:
    """A calculator trajectory of up to 3 turns of 32 tokens and two 48-token tool results holds
    2 x (48 + 16) + 3 x 32 = 224 tokens after the prompt: planned as one turn of that length."""
    cfg = TrainConfig()
    cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens = 16, 32
    single = plan(cfg)
    cfg.env = EnvConfig(name="calculator", max_turns=3, max_observation_tokens=48)
    multi = plan(cfg)
    cfg.env, cfg.rollout.max_new_tokens = EnvConfig(), 224
    as_one_turn = plan(cfg)
    for name in ("KV cache + sampling", "activations"):
        assert part(multi, name).bytes > part(single, name).bytes
        assert part(multi, name).bytes == part(as_one_turn, name).bytes


def test_a_plan_that_does_not_fit_names_its_biggest_part_and_the_overrides_that_help() -> None:
    cfg = TrainConfig()
    cfg.model.tiny.hidden_size, cfg.model.tiny.num_layers, cfg.model.tiny.intermediate_size = 512, 8, 2048
    cfg.rollout.max_new_tokens = 256
    roomy = plan(cfg, free=64 * GIB)
    assert roomy.fits and roomy.warning() is None and roomy.knobs == []
    tight = plan(cfg, free=roomy.peak // 2)
    assert not tight.fits
    warning = tight.warning()
    assert warning is not None and tight.biggest.name == "activations" and "the biggest part is activations" in warning
    overrides = [override for override, _ in tight.knobs]
    assert "model.gradient_checkpointing=true" in overrides and "train.grad_accum_steps=4" in overrides
    assert all(peak < tight.peak for _, peak in tight.knobs)
    assert "model.gradient_checkpointing=true" in warning
    hopeless = plan(cfg, free=roomy.peak // 100)  # no single override is enough: the harmless ones together lead
    together, together_peak = hopeless.knobs[0]
    assert together.split() == ["train.grad_accum_steps=4", "model.gradient_checkpointing=true", "precision=bf16"]
    assert together_peak < min(peak for _, peak in hopeless.knobs[1:])


def test_free_memory_on_this_cpu_is_a_positive_byte_count() -> None:
    free = free_memory(CPU)
    if sys.platform == "linux":  # /proc/meminfo's MemAvailable is always there
        assert free is not None
    assert free is None or free > 2**20


def test_plan_true_prints_the_table_and_loads_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_grpo("train", "plan=true", "monitor.console=plain", "algo.beta=0.04", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "memory plan" in out and "expected peak" in out
    for name in ("weights", "reference model", "optimizer state", "KV cache", "activations", "logits", "gradients"):
        assert name in out
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "tiny_model").exists()  # not even the tiny model was built


def test_under_bnpo_gradient_accumulation_is_not_offered_as_leaving_the_training_unchanged() -> None:
    """bnpo divides each micro-batch by its own tokens (core.update), so splitting a mini-batch changes
    the update there: the harmless overrides that lead a hopeless plan leave it out."""
    cfg = TrainConfig()
    cfg.model.tiny.hidden_size, cfg.model.tiny.num_layers, cfg.model.tiny.intermediate_size = 512, 8, 2048
    cfg.rollout.max_new_tokens, cfg.algo.loss_type = 256, "bnpo"
    hopeless = plan(cfg, free=plan(cfg, free=64 * GIB).peak // 100)
    assert hopeless.knobs[0][0].split() == ["model.gradient_checkpointing=true", "precision=bf16"]
    assert "train.grad_accum_steps=4" in [override for override, _ in hopeless.knobs[1:]]
