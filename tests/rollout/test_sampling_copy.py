"""rollout.sampling_weights: grpo train's rollouts decode a bf16 copy of an fp32 policy where the
device multiplies bf16 natively and the model is big enough; the copy follows every update, its
log-probs go with the rollout for the rollout correction, greedy evaluation decodes the policy, and
each way the choice falls back says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_cli.config.schema import ModelConfig, RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator, HFGenerator, make_generator, with_sampling_weights
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.rollout.sampling_copy import MIN_PARAMETERS, SamplingCopy, native_bf16
from grpo_cli.training import GRPOTrainer
from tests.training.test_trainer import small_config

CPU = torch.device("cpu")
PROMPTS = ["12+7=", "3+4=", "100+250=", "9+9="]
NATIVE = native_bf16(CPU)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    model, tokenizer, _ = load_policy(ModelConfig(), tmp_path_factory.mktemp("tiny"), 0, CPU, "fp32")
    torch.manual_seed(0)
    with torch.no_grad():  # a distribution with a head and a tail: the random init is nearly uniform
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    ids, mask = PromptEncoder(tokenizer, 64, CPU)(PROMPTS)
    return model, tokenizer, ids, mask


def full_logps(model, rollout, temperature: float) -> torch.Tensor:
    """Each sampled token's log-prob under `model` from one forward over prompt + completion."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    logits = logits[:, rollout.prompt_ids.size(1) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(2, rollout.completion_ids.unsqueeze(2)).squeeze(2)


def test_the_copy_is_bf16_but_its_buffers_and_the_policy_stay_fp32(tiny) -> None:
    model, _, _, _ = tiny
    copy = SamplingCopy(model)
    assert {p.dtype for p in copy.module.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in copy.module.buffers() if b.is_floating_point()} == {torch.float32}  # rotary frequencies
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert copy.bytes() * 2 == sum(p.numel() * 4 for p in model.parameters())


def test_sampled_rollouts_carry_the_engines_log_probs_row_by_row(tiny) -> None:
    """The bookkeeping, exactly: a copy turned back to fp32 is the policy, so the log-probs the loop
    records (temperature applied, rows leaving the batch at EOS, NaN past a row's end) must be the
    policy's own from one full forward."""
    model, tokenizer, ids, mask = tiny
    cfg = RolloutConfig(max_new_tokens=8, temperature=0.7)
    copy = SamplingCopy(model)
    copy.module.float()
    copy.refresh()  # the policy's fp32 values, not the bf16 ones cast back
    generator = FastGenerator(model, tokenizer, cfg, copy)
    torch.manual_seed(0)
    first = generator.generate(ids, mask, 4).completion_ids
    generator.eos_ids = [int(first[:, 1:4].flatten().mode().values)]  # a token it samples early: rows end apart
    torch.manual_seed(0)
    sampled = generator.generate(ids, mask, 4)
    real = sampled.completion_mask.bool()
    assert real.sum(-1).min() < real.sum(-1).max()
    assert sampled.engine_logps.shape == sampled.completion_ids.shape
    expected = full_logps(model, sampled, 0.7)
    assert torch.allclose(sampled.engine_logps[real], expected[real], atol=1e-4)
    assert sampled.engine_logps[~real].isnan().all()


def test_the_bf16_copy_samples_close_to_the_policy_and_greedy_decodes_the_policy(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    cfg = RolloutConfig(max_new_tokens=8, temperature=0.7)
    generator = FastGenerator(model, tokenizer, cfg, SamplingCopy(model))
    torch.manual_seed(0)
    sampled = generator.generate(ids, mask, 4)
    real = sampled.completion_mask.bool()
    gap = (sampled.engine_logps - full_logps(model, sampled, 0.7))[real].abs().mean()
    # bf16 rounding: not the policy's numbers, nor another policy's (this shaken model's logits are
    # large, so its rounding is too: ~0.16 here, ~0.04 on SmolLM2-135M)
    assert 1e-4 < gap < 0.3
    greedy = generator.generate(ids, mask, 1, greedy=True)
    plain = FastGenerator(model, tokenizer, cfg).generate(ids, mask, 1, greedy=True)
    assert greedy.engine_logps is None and torch.equal(greedy.completion_ids, plain.completion_ids)


def test_the_copy_follows_the_trained_weights_only(tiny) -> None:
    """Refreshed after an update from the parameters that train; a frozen one (a LoRA run's base) is
    never copied again."""
    model, tokenizer, _, _ = tiny
    frozen = model.get_input_embeddings().weight
    frozen.requires_grad_(False)
    try:
        generator = FastGenerator(model, tokenizer, RolloutConfig(), SamplingCopy(model))
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        with torch.no_grad():
            for _, parameter in trained:
                parameter.add_(0.25)
            frozen.add_(0.25)
        generator.weights_updated()
        copied = dict(generator.copy.module.named_parameters())
        for name, parameter in trained:
            assert torch.equal(copied[name], parameter.to(torch.bfloat16)), name
        embedding = generator.copy.module.get_input_embeddings().weight
        assert not torch.equal(embedding, frozen.to(torch.bfloat16))
        with torch.no_grad():
            frozen.sub_(0.25)
            for _, parameter in trained:
                parameter.sub_(0.25)
    finally:
        frozen.requires_grad_(True)


def big_model() -> LlamaForCausalLM:
    """Just over MIN_PARAMETERS: where auto takes the copy (built in code, never saved)."""
    config = LlamaConfig(
        vocab_size=259, hidden_size=1024, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=8
    )
    model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) > MIN_PARAMETERS
    return model


@pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16 matrix multiply")
def test_auto_takes_the_copy_for_a_real_sized_model_on_a_native_bf16_device(tiny) -> None:
    _, tokenizer, _, _ = tiny
    model = big_model()
    generator, _ = make_generator(model, tokenizer, RolloutConfig())
    generator, used, line = with_sampling_weights(generator, model, tokenizer, RolloutConfig())
    assert used and isinstance(generator, FastGenerator) and generator.copy is not None
    assert line == "a bf16 copy of the policy (rollout.sampling_weights=auto: this cpu computes bf16 natively)"


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("auto", "the policy's weights (a model under 20M parameters decodes as fast in fp32)"),
        ("policy", "the policy's weights (rollout.sampling_weights=policy)"),
    ],
)
def test_the_tiny_model_and_policy_decode_the_policy_and_say_why(tiny, setting: str, words: str) -> None:
    model, tokenizer, _, _ = tiny
    cfg = RolloutConfig(sampling_weights=setting)
    generator, _ = make_generator(model, tokenizer, cfg)
    generator, used, line = with_sampling_weights(generator, model, tokenizer, cfg)
    assert not used and generator.copy is None and line == words


def test_auto_falls_back_where_the_device_has_no_native_bf16(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's answer turned to no, as on a CPU without AVX512-BF16 or AMX."""
    _, tokenizer, _, _ = tiny
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    model = big_model()
    generator, _ = make_generator(model, tokenizer, RolloutConfig())
    generator, used, line = with_sampling_weights(generator, model, tokenizer, RolloutConfig())
    assert not used and line == "the policy's weights (this cpu has no native bf16 matrix multiply)"


def test_bf16_insists_and_fails_where_no_copy_can_sample(tiny) -> None:
    model, tokenizer, _, _ = tiny
    on_generate = RolloutConfig(sampling_weights="bf16", loop="generate")
    generator, _ = make_generator(model, tokenizer, on_generate)
    assert isinstance(generator, HFGenerator)
    with pytest.raises(
        GrpoError, match="rollout.sampling_weights=bf16 cannot be used here: the copy samples in the fast"
    ):
        with_sampling_weights(generator, model, tokenizer, on_generate)
    half = big_model().to(torch.bfloat16)
    insist = RolloutConfig(sampling_weights="bf16")
    generator, _ = make_generator(half, tokenizer, insist)
    with pytest.raises(GrpoError, match="the policy's weights are not all fp32"):
        with_sampling_weights(generator, half, tokenizer, insist)


def test_a_run_on_the_copy_trains_and_reports_the_gap(tmp_path: Path) -> None:
    """The trainer's own wiring: the start-up words, the gap each step, and the copy refreshed after
    each update (the gap stays at rounding size while the weights move at the tiny model's lr)."""
    cfg = small_config(steps=3)
    cfg.rollout.sampling_weights = "bf16"
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    try:
        assert trainer.diagnostics["sampling_weights"] == "a bf16 copy of the policy (rollout.sampling_weights=bf16)"
        history = trainer.train()
    finally:
        trainer.cleanup()
    gaps = [row["rollout/engine_gap"] for row in history]
    assert all(0 < gap < 0.1 for gap in gaps), gaps
    assert all(row["grad_norm"] > 0 for row in history)


def test_the_trainer_refreshes_the_copy_after_every_update(tmp_path: Path) -> None:
    """Through the real trainer step: after each update the copy holds the trained weights exactly
    (bf16 of the new fp32), and the weights move far enough that a copy left stale would not."""
    cfg = small_config(steps=3)
    cfg.rollout.sampling_weights = "bf16"  # takes the copy on any CPU (emulated where not native)
    behind: list[float] = []  # per step: the largest |copy - bf16(policy)| over the trained parameters

    class CopyWatch:
        def on_step(self, result) -> None:
            copied = dict(trainer.generator.copy.module.named_parameters())
            trained = [(n, p.detach()) for n, p in trainer.model.named_parameters() if p.requires_grad]
            behind.append(
                max((copied[n].float() - p.to(torch.bfloat16).float()).abs().max().item() for n, p in trained)
            )

    trainer = GRPOTrainer(cfg, tmp_path, [CopyWatch()])
    trainer.setup()
    try:
        start = {n: p.detach().to(torch.bfloat16) for n, p in trainer.model.named_parameters()}
        trainer.train()
        moved = [
            n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach().to(torch.bfloat16), start[n])
        ]
    finally:
        trainer.cleanup()
    assert behind == [0.0, 0.0, 0.0]
    assert len(moved) > len(start) // 2, moved  # a stale copy would differ in most of them
