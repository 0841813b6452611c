"""The real engine samples the policy being trained, by behaviour: the mean |engine − policy|
log-prob of the sampled tokens (what `rollout/engine_gap` logs) sits at fp32's noise floor as
loaded, grows past 0.1 once the policy moves without a push, and is back at the floor after one.
Every path the code takes: the engine core in a child process and in this one, a plain and a LoRA
policy (merged weights), through the trainer with its corrections, across a resume."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import LoraConfig, RolloutConfig, TrainConfig, VllmConfig
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.core.objective import engine_gap_sum
from grpo_cli.lora import add_lora
from grpo_cli.models import build_tiny_model, load_tokenizer
from grpo_cli.rollout import Rollout, VLLMGenerator, make_generator
from grpo_cli.training import GRPOTrainer
from tests.conftest import Recorder
from tests.vllm.conftest import HEAD_32

PROMPTS = ["12+7=", "3+4=", "100+250="]
FLOOR = 1e-5  # fp32 engine against fp32 transformers: ~2e-7 measured on this model
STALE = 0.1  # what a policy moved without a push reads (0.3 measured)


def rollout_config(multiprocessing: bool = True) -> RolloutConfig:
    return RolloutConfig(
        backend="vllm",
        max_new_tokens=8,
        num_generations=4,
        vllm=VllmConfig(dtype="fp32", multiprocessing=multiprocessing),
    )


def engine_gap(generator: VLLMGenerator, policy: torch.nn.Module, encoded: dict) -> float:
    """One sampled generation's rollout/engine_gap, through the helper the loss calls."""
    rollout: Rollout = generator.generate(encoded["input_ids"], encoded["attention_mask"], 4)
    assert rollout.engine_logps is not None
    with torch.no_grad():
        policy_logps, _ = rows_logprobs(
            policy, rollout, torch.arange(rollout.completion_ids.size(0)), 1.0, "padded", with_entropy=False
        )
    mask = rollout.completion_mask.float()
    return engine_gap_sum(policy_logps, rollout.engine_logps, mask) / mask.sum().item()


def moved(policy: torch.nn.Module) -> None:
    """A large update through the policy module: every MLP's output projection zeroed and the
    embedding scaled, so a stale packed copy of either (the tied LM head included) shows."""
    with torch.no_grad():
        for layer in policy.model.layers:
            layer.mlp.down_proj.weight.zero_()
        policy.model.embed_tokens.weight.mul_(3.0)


@pytest.mark.parametrize("multiprocessing", [True, False], ids=["child_process", "in_process"])
def test_the_engine_samples_the_policy_and_a_push_reaches_it(head32_dir: Path, multiprocessing: bool) -> None:
    tokenizer = load_tokenizer(head32_dir)
    policy = AutoModelForCausalLM.from_pretrained(head32_dir)
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    threads = torch.get_num_threads()
    generator, line = make_generator(policy, tokenizer, rollout_config(multiprocessing), max_prompt_tokens=32)
    try:
        assert ("child process" if multiprocessing else "this process") in line
        assert torch.get_num_threads() == threads  # an in-process engine leaves the trainer its threads
        assert engine_gap(generator, policy, encoded) < FLOOR
        moved(policy)
        assert engine_gap(generator, policy, encoded) > STALE  # no push yet: the engine samples the old policy
        generator.weights_updated()
        assert engine_gap(generator, policy, encoded) < FLOOR  # the push reached what is sampled
        assert generator.sync.stats.pushes == 2 and generator.shared.path.exists()
    finally:
        generator.close()
    assert not generator.shared.path.exists()


def test_a_push_drops_the_prompt_kv_the_engine_cached_before_it(tmp_path: Path) -> None:
    """vLLM keeps the KV of a prompt's full blocks (prefix caching) and serves it again to the same
    prompt; after a push that KV is the old weights'. A prompt of 490 tokens (a full block at any
    block size) sampled before and after a push: the second sampling is the new policy's, so the
    cache was dropped with the push (the short prompts above fill no block, and would pass either way)."""
    size = dataclasses.replace(HEAD_32, max_position_embeddings=1024)
    model_dir = build_tiny_model(tmp_path / "model", size, seed=0)
    tokenizer = load_tokenizer(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    encoded = tokenizer(["+".join(str(i) for i in range(150)) + "="], return_tensors="pt")
    prompt_tokens = encoded["input_ids"].size(1)
    assert prompt_tokens > 256  # a full block at any of vLLM's block sizes (256 at most): a cached prefix
    generator, _ = make_generator(policy, tokenizer, rollout_config(), max_prompt_tokens=prompt_tokens)
    try:
        assert engine_gap(generator, policy, encoded) < FLOOR  # the prompt's blocks are cached now
        moved(policy)
        generator.weights_updated()
        assert engine_gap(generator, policy, encoded) < FLOOR  # a kept cache would serve the old weights' KV
        assert generator.sync.stats.pushes == 2
    finally:
        generator.close()


def test_a_lora_policy_reaches_the_engine_merged(head32_dir: Path) -> None:
    tokenizer = load_tokenizer(head32_dir)
    base = AutoModelForCausalLM.from_pretrained(head32_dir)
    policy = add_lora(
        copy.deepcopy(base), LoraConfig(enabled=True, r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero: give the adapters an update to merge
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    policy.eval()  # adapter dropout off: the policy's log-probs are the merged weights'
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    generator, _ = make_generator(policy, tokenizer, rollout_config(), max_prompt_tokens=32)
    try:
        assert engine_gap(generator, policy, encoded) < FLOOR
        assert engine_gap(generator, base, encoded) > STALE  # the adapters' update is what the engine samples
    finally:
        generator.close()


def trainer_config(steps: int, mode: str = "token_truncate") -> TrainConfig:
    """The tiny run at its own large lr (2e-3), its model of 32-wide heads, a vLLM engine in fp32."""
    cfg = TrainConfig()
    cfg.model.tiny = copy.deepcopy(HEAD_32)
    cfg.rollout.backend, cfg.rollout.vllm.dtype = "vllm", "fp32"
    cfg.train.steps, cfg.train.prompts_per_step, cfg.train.save_every = steps, 4, 2
    cfg.algo.rollout_correction.mode = mode
    cfg.monitor.plots = False
    return cfg


def train(cfg: TrainConfig, run_dir: Path) -> list[dict]:
    """The metrics of the steps this trainer ran (a resumed one: the steps after its checkpoint)."""
    recorder = Recorder()
    trainer = GRPOTrainer(cfg, run_dir, [recorder])
    trainer.setup()
    try:
        trainer.train()
    finally:
        trainer.cleanup()
    return [result.metrics for result in recorder.results]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return train(trainer_config(4), tmp_path_factory.mktemp("straight"))


def test_training_keeps_the_engine_on_policy_and_the_corrections_at_one(straight_run: list[dict]) -> None:
    """4 updates at lr 2e-3: the gap stays at the floor, so TIS weights are 1 and nothing alerts."""
    assert [m["step"] for m in straight_run] == [1, 2, 3, 4]
    for metrics in straight_run:
        assert 0 < metrics["rollout/engine_gap"] < FLOOR, metrics["step"]
        assert metrics["rollout_correction/weight"] == pytest.approx(1.0, abs=FLOOR)
        assert metrics["rollout_correction/capped"] == 0
    assert straight_run[-1]["grad_norm"] > 0 and straight_run[0]["reward/mean"] != straight_run[-1]["reward/mean"]


def test_masked_importance_sampling_keeps_every_token_at_the_floor(tmp_path: Path) -> None:
    (metrics,) = train(trainer_config(1, mode="sequence_mask"), tmp_path)
    assert metrics["rollout_correction/weight"] == pytest.approx(1.0, abs=FLOOR)  # no sequence masked out
    assert metrics["rollout/engine_gap"] < FLOOR


def test_a_resumed_run_draws_and_trains_what_the_straight_run_did(straight_run: list[dict], tmp_path: Path) -> None:
    """2 steps, then a new trainer (a new engine, loaded from the model directory) resumes to 4:
    the first push carries the checkpoint's weights and the requests are seeded from the step."""
    train(trainer_config(2), tmp_path)
    resumed = train(trainer_config(4), tmp_path)
    assert [m["step"] for m in resumed] == [3, 4]
    for straight, again in zip(straight_run[2:], resumed):
        assert again["reward/mean"] == straight["reward/mean"]
        assert again["completion_len/mean"] == straight["completion_len/mean"]
        assert again["loss"] == pytest.approx(straight["loss"], abs=1e-6)
        assert again["rollout/engine_gap"] < FLOOR
        assert not math.isnan(again["grad_norm"])


def test_a_pipelined_run_samples_with_the_engine_k_steps_behind(straight_run: list[dict], tmp_path: Path) -> None:
    """rollout.max_staleness=1 on the engine: the first batch is the straight run's (the same weights,
    the same request seeds), its gap at the floor; every later batch is sampled by the policy of the
    step before, so its gap is the update's movement, and the correction weighs it."""
    cfg = trainer_config(4)
    cfg.rollout.max_staleness = 1
    cfg.optim.warmup_steps = 0  # the first update moves the weights (its loss is computed before it)
    pipelined = train(cfg, tmp_path)
    assert [m["async/staleness"] for m in pipelined] == [0, 1, 1, 1]
    first, straight = pipelined[0], straight_run[0]
    assert first["reward/mean"] == straight["reward/mean"]
    assert first["loss"] == pytest.approx(straight["loss"], abs=1e-6)
    assert first["rollout/engine_gap"] < FLOOR
    for metrics in pipelined[1:]:
        assert metrics["rollout/engine_gap"] > 1000 * FLOOR, metrics["step"]  # 0.06-0.07 measured
        assert metrics["rollout_correction/weight"] != pytest.approx(1.0, abs=FLOOR)
