"""The fast sampling loop against `generate` and a full forward, on the tiny model loaded through
`from_pretrained`: the same greedy tokens (early EOS rows dropped included), the same sampling
distribution, and the fallback rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch

from grpo_cli.config.schema import LoraConfig, ModelConfig, RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator, HFGenerator, make_generator
from grpo_cli.rollout.engine import fast_loop_unsupported
from grpo_cli.rollout.prompts import PromptEncoder

PROMPTS = ["12+7=", "3+4=", "100+250=", "9+9="]  # different lengths: left padding in the batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    model, tokenizer, _ = load_policy(
        ModelConfig(), tmp_path_factory.mktemp("tiny"), seed=0, device=torch.device("cpu"), precision_dtype="fp32"
    )
    ids, mask = PromptEncoder(tokenizer, 64, torch.device("cpu"))(PROMPTS)
    return model, tokenizer, ids, mask


def _both(tiny, **rollout) -> tuple[FastGenerator, HFGenerator]:
    model, tokenizer, _, _ = tiny
    cfg = RolloutConfig(**rollout)
    return FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg)


def test_greedy_tokens_equal_generate_including_rows_dropped_at_an_early_eos(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    noisy = copy.deepcopy(model)  # the random init answers "=" to everything: shake it to vary the answers
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.add_(torch.randn_like(parameter))
    fast, slow = _both((noisy, tokenizer, ids, mask), max_new_tokens=12)
    reference = slow.generate(ids, mask, 2, greedy=True)
    assert torch.equal(fast.generate(ids, mask, 2, greedy=True).completion_ids, reference.completion_ids)
    # Make a token some rows emit later (never first) an end-of-sequence: rows stop at different steps
    first = set(reference.completion_ids[:, 0].tolist())
    stop = next(t for t in reference.completion_ids[:, 1:].flatten().tolist() if t not in first)
    fast.eos_ids = [stop]
    slow.eos_ids = slow.greedy.eos_token_id = [stop]
    early_fast, early_slow = fast.generate(ids, mask, 2, greedy=True), slow.generate(ids, mask, 2, greedy=True)
    assert early_fast.lengths.tolist() == early_slow.lengths.tolist()
    assert early_fast.lengths.min() < early_fast.lengths.max()  # some rows did stop early
    assert torch.equal(
        early_fast.completion_ids * early_fast.completion_mask, early_slow.completion_ids * early_slow.completion_mask
    )
    assert early_fast.texts == early_slow.texts and early_fast.truncated.tolist() == early_slow.truncated.tolist()


def test_sampling_follows_generates_distribution_with_temperature_top_k_and_top_p(tiny) -> None:
    model, _, ids, mask = tiny
    settings = {"max_new_tokens": 1, "temperature": 0.7, "top_k": 6, "top_p": 0.9}
    fast, slow = _both(tiny, **settings)
    one = (ids[:1], mask[:1])
    draws = 6000
    torch.manual_seed(1)
    fast_tokens = fast.generate(*one, draws).completion_ids[:, 0]
    torch.manual_seed(2)
    slow_tokens = slow.generate(*one, draws).completion_ids[:, 0]
    logits = model(input_ids=one[0], attention_mask=one[1]).logits[0, -1].float()
    exact = fast.warpers(None, logits[None])[0].softmax(-1)  # what both should sample from
    assert int((exact > 0).sum()) <= 6  # top-k and top-p did cut the vocabulary
    for tokens in (fast_tokens, slow_tokens):
        seen = torch.bincount(tokens, minlength=exact.numel()).float() / draws
        assert set(tokens.unique().tolist()) <= set((exact > 0).nonzero().squeeze(1).tolist())
        assert 0.5 * (seen - exact).abs().sum() < 0.03  # total variation; ~0.01 from 6000 draws


def test_auto_takes_the_fast_loop_for_the_tiny_model_and_generate_insists_on_generate(tiny) -> None:
    model, tokenizer, _, _ = tiny
    assert fast_loop_unsupported(model) is None
    generator, loop = make_generator(model, tokenizer, RolloutConfig())
    assert isinstance(generator, FastGenerator) and loop == "fast, fixed-shape decode"
    generator, loop = make_generator(model, tokenizer, RolloutConfig(loop="fast"))
    assert isinstance(generator, FastGenerator) and generator.decoder(model) is None
    assert loop == "fast (rollout.loop=fast: the model's forward, finished rows dropped)"
    generator, loop = make_generator(model, tokenizer, RolloutConfig(loop="generate"))
    assert isinstance(generator, HFGenerator) and loop == "generate (rollout.loop=generate)"


def test_an_encoder_decoder_model_falls_back_to_generate_and_fast_says_why(tiny) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    _, tokenizer, _, _ = tiny
    config = T5Config(vocab_size=300, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(config)
    assert fast_loop_unsupported(model) == "an encoder-decoder model"
    generator, loop = make_generator(model, tokenizer, RolloutConfig())
    assert isinstance(generator, HFGenerator) and loop == "generate (an encoder-decoder model)"
    with pytest.raises(GrpoError, match="rollout.loop=fast cannot drive this model: an encoder-decoder model"):
        make_generator(model, tokenizer, RolloutConfig(loop="fast"))


def test_the_trainer_reports_the_loop_in_its_summary(smoke_run: tuple[CompletedProcess, Path]) -> None:
    result, run_dir = smoke_run  # `grpo train debug=smoke`, shared with tests/e2e/test_plain_output.py
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["rollout_loop"] == "fast, fixed-shape decode"


def test_min_new_tokens_forces_every_length_in_both_loops(tiny) -> None:
    _, tokenizer, ids, mask = tiny
    fast, slow = _both(tiny, max_new_tokens=6, min_new_tokens=6)
    digits = [tokenizer.encode(d, add_special_tokens=False)[0] for d in "0123456789"]
    fast.eos_ids = slow.eos_ids = slow.sampling.eos_token_id = digits  # a digit would end a completion early
    torch.manual_seed(0)
    for generator in (fast, slow):
        rollout = generator.generate(ids, mask, 4)
        assert rollout.lengths.tolist() == [6] * 16 and not any(set(t) & set("0123456789") for t in rollout.texts)


def test_a_lora_policy_decodes_through_its_forward_and_loop_fixed_says_why(tmp_path: Path) -> None:
    # a LoRA layer keeps the base `weight` the fixed path would multiply without the adapters' delta;
    # the adapters start at zero, so a probe of the logits alone could not tell: the layer types decide
    lora = LoraConfig(enabled=True, r=4, target_modules=["q_proj", "v_proj"])
    model, tokenizer, _ = load_policy(
        ModelConfig(lora=lora), tmp_path, seed=0, device=torch.device("cpu"), precision_dtype="fp32"
    )
    generator, loop = make_generator(model, tokenizer, RolloutConfig())
    assert isinstance(generator, FastGenerator) and generator.decoder(model) is None
    assert loop.startswith("fast, through the model's forward (") and "plain linear layers" in loop, loop
    with pytest.raises(GrpoError, match="rollout.loop=fixed cannot decode this model: .*plain linear layers"):
        make_generator(model, tokenizer, RolloutConfig(loop="fixed"))


def test_the_fixed_shape_decode_samples_what_the_forward_path_samples(tiny) -> None:
    # rows end at different steps (masked on one path, dropped on the other) and both draw for the
    # running rows only: one seed gives the same tokens on both, and log-probs equal to float rounding
    model, tokenizer, ids, mask = tiny
    cfg = RolloutConfig(max_new_tokens=8)
    fixed = FastGenerator(model, tokenizer, cfg)
    dropping = FastGenerator(model, tokenizer, cfg, fixed=False)
    fixed.eos_ids = dropping.eos_ids = list(range(3, len(tokenizer), 5))  # rows end early, at different steps
    torch.manual_seed(3)
    ours, our_logps = fixed.sample(ids, mask, 4, scored=True)
    torch.manual_seed(3)
    theirs, their_logps = dropping.sample(ids, mask, 4, scored=True)
    assert fixed.decoder(model) is not None and dropping.decoder(model) is None
    lengths = our_logps.isfinite().sum(1)
    assert lengths.min() < lengths.max()
    assert torch.equal(ours, theirs)
    assert torch.equal(our_logps.isnan(), their_logps.isnan())
    assert (our_logps - their_logps).nan_to_num().abs().max() < 1e-5
