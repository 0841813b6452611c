"""rollout.min_p, rollout.repetition_penalty and rollout.generation_kwargs (TRL's knobs of the same
names) in every loop: the fast loop samples and picks what transformers' own processors
(MinPLogitsWarper, RepetitionPenaltyLogitsProcessor) give on the same logits, generate gets them and
the generation_kwargs, vLLM's SamplingParams carry them, and a key that two places would set is
refused before any model loads."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.schema import DataConfig, ModelConfig, RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator, HFGenerator, VLLMGenerator, make_generator
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.rollout.vllm import sampling_params_kwargs

PROMPTS = ["12+7=", "3+4=", "100+250=", "9+9="]  # different lengths: left padding in the batch
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    model, tokenizer, _ = load_policy(ModelConfig(), tmp_path_factory.mktemp("tiny"), 0, CPU, "fp32")
    ids, mask = PromptEncoder(tokenizer, 64, CPU)(PROMPTS)
    return model, tokenizer, ids, mask


def shaken(model, scale: float):
    """A copy with noise added to every weight: the random init is nearly uniform and answers "="
    to everything; a little noise gives a next-token distribution with a head and a tail, a lot
    gives greedy answers that vary."""
    noisy = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.add_(torch.randn_like(parameter) * scale)
    return noisy


def next_token_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, -1].float()


# ---- min_p -------------------------------------------------------------------------------------


def test_min_p_cuts_what_both_loops_sample_as_generates_warper_does(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    model = shaken(model, 0.1)
    one = ids[:1], mask[:1]
    temperature, min_p, draws = 1.0, 0.3, 4000
    logits = next_token_logits(model, *one)
    expected = MinPLogitsWarper(min_p)(None, TemperatureLogitsWarper(temperature)(None, logits))[0].softmax(-1)
    support = set(expected.nonzero().squeeze(1).tolist())
    assert 2 < len(support) < expected.numel() // 4  # a real cut of the vocabulary
    cfg = RolloutConfig(max_new_tokens=1, temperature=temperature, min_p=min_p)
    for seed, generator in enumerate((FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg))):
        torch.manual_seed(seed)
        tokens = generator.generate(*one, draws).completion_ids[:, 0]
        assert set(tokens.unique().tolist()) <= support, type(generator).__name__
        seen = torch.bincount(tokens, minlength=expected.numel()).float() / draws
        assert 0.5 * (seen - expected).abs().sum() < 0.05  # total variation; ~0.02 expected from 4000 draws
    torch.manual_seed(0)  # without the knob the same settings sample outside that support
    plain = FastGenerator(model, tokenizer, RolloutConfig(max_new_tokens=1, temperature=temperature))
    assert not set(plain.generate(*one, draws).completion_ids[:, 0].tolist()) <= support


# ---- repetition_penalty ------------------------------------------------------------------------


def penalised_greedy(
    model, prompt: list[int], steps: int, penalty: float, stop: set[int], min_new_tokens: int = 0
) -> list[int]:
    """Greedy decoding of one unpadded prompt by full forwards, each step's logits through
    transformers' RepetitionPenaltyLogitsProcessor over everything so far, then its
    MinNewTokensLengthLogitsProcessor banning the stop tokens: what generate does, in its order."""
    context, out = list(prompt), []
    for _ in range(steps):
        logits = next_token_logits(model, torch.tensor([context]), torch.ones(1, len(context), dtype=torch.long))
        scores = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([context]), logits)
        if stop and min_new_tokens:
            length = torch.tensor([context])
            ban = MinNewTokensLengthLogitsProcessor(len(prompt), min_new_tokens, sorted(stop))
            scores = ban(length, scores)
        token = int(scores.argmax(-1))
        context.append(token)
        out.append(token)
        if token in stop:
            break
    return out


def completions(rollout) -> list[list[int]]:
    return [row[: int(n)] for row, n in zip(rollout.completion_ids.tolist(), rollout.completion_mask.sum(-1))]


def test_repetition_penalty_changes_both_loops_greedy_answers_as_generates_processor_does(tiny) -> None:
    """Greedy, batched with left padding, rows stopping at different steps (a stop token chosen from
    the answers): the padding is no part of any row's context, and the context follows each row as
    finished rows leave the fast loop's batch."""
    model, tokenizer, ids, mask = tiny
    model = shaken(model, 1.0)
    penalty, steps = 2.0, 12
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    free = [penalised_greedy(model, p, steps, penalty, set()) for p in prompts]
    unpenalised = [penalised_greedy(model, p, steps, 1.0, set()) for p in prompts]
    assert free != unpenalised  # the penalty changes the answers
    firsts = {row[0] for row in free}
    stop = next(t for row in free for t in row[1:] if t not in firsts)
    expected = [penalised_greedy(model, p, steps, penalty, {stop}) for p in prompts]
    assert min(map(len, expected)) < max(map(len, expected))  # some rows stop early
    cfg = RolloutConfig(max_new_tokens=steps, repetition_penalty=penalty)
    fast, slow = FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg)
    fast.eos_ids = [stop]
    slow.eos_ids = slow.greedy.eos_token_id = [stop]
    assert completions(fast.generate(ids, mask, 1, greedy=True)) == expected
    assert completions(slow.generate(ids, mask, 1, greedy=True)) == expected


def test_min_new_tokens_bans_the_stop_token_from_the_penalised_logits(tiny) -> None:
    """Both processors at once, in generate's order: the ban starts from the penalised scores (it
    once started from the raw logits in the fast loop, dropping the penalty for the first
    min_new_tokens steps). The stop token is one some row picks within those steps, so the ban
    changes that row's answer, and the penalty changes what some row says inside them."""
    model, tokenizer, ids, mask = tiny
    model = shaken(model, 1.0)
    penalty, steps, min_new = 2.0, 10, 6
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    free = [penalised_greedy(model, p, steps, penalty, set()) for p in prompts]
    stop = next(t for row in free for t in row[1:min_new])
    expected = [penalised_greedy(model, p, steps, penalty, {stop}, min_new) for p in prompts]
    unbanned = [penalised_greedy(model, p, steps, penalty, {stop}) for p in prompts]
    unpenalised = [penalised_greedy(model, p, steps, 1.0, {stop}, min_new) for p in prompts]
    assert expected != unbanned
    assert any(a[:min_new] != b[:min_new] for a, b in zip(expected, unpenalised))  # the penalty acts within the ban
    assert all(len(row) > min_new for row in expected)  # nothing stopped inside the ban
    cfg = RolloutConfig(max_new_tokens=steps, repetition_penalty=penalty, min_new_tokens=min_new)
    fast, slow = FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg)
    fast.eos_ids = [stop]
    slow.eos_ids = slow.greedy.eos_token_id = [stop]
    assert completions(fast.generate(ids, mask, 1, greedy=True)) == expected
    assert completions(slow.generate(ids, mask, 1, greedy=True)) == expected


def test_the_prompts_left_padding_is_not_penalised(tiny) -> None:
    """generate leaves each row's padding out of the penalty (prompt_ignore_length), so a row's answer
    cannot depend on how long the other prompts of its batch are. Made to matter here: the pad
    token's output row is set so that it is the most padded row's favourite first token, which a
    penalty on the padding would push below the token it was copied from."""
    model, tokenizer, ids, mask = tiny
    model, penalty = shaken(model, 1.0), 2.0
    padded = int((mask == 0).sum(-1).argmax())
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    favourite = penalised_greedy(model, prompts[padded], 1, penalty, set())[0]
    head = model.get_output_embeddings().weight
    with torch.no_grad():  # tied: the pad's embedding too, which only padding (masked out) reads
        head[tokenizer.pad_token_id] = head[favourite] * 1.02
    expected = [penalised_greedy(model, p, 1, penalty, set()) for p in prompts]
    assert expected[padded] == [tokenizer.pad_token_id]  # positive logit: a penalised pad would lose to `favourite`
    cfg = RolloutConfig(max_new_tokens=1, repetition_penalty=penalty)
    for generator in (FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg)):
        assert generator.generate(ids, mask, 1, greedy=True).completion_ids.tolist() == expected


# ---- generation_kwargs -------------------------------------------------------------------------


def test_generation_kwargs_reach_generate_and_make_auto_fall_back_to_it(tiny) -> None:
    model, tokenizer, ids, mask = tiny
    model = shaken(model, 0.1)
    plain, _ = make_generator(model, tokenizer, RolloutConfig(max_new_tokens=6))
    favourite = int(plain.generate(ids[:1], mask[:1], 1, greedy=True).completion_ids[0, 0])
    cfg = RolloutConfig(max_new_tokens=6, temperature=0.3, generation_kwargs={"suppress_tokens": [favourite]})
    generator, line = make_generator(model, tokenizer, cfg)
    assert (
        isinstance(generator, HFGenerator)
        and line == "generate (rollout.generation_kwargs (suppress_tokens) are options of generate)"
    )
    greedy = generator.generate(ids, mask, 1, greedy=True).completion_ids
    torch.manual_seed(0)
    sampled = generator.generate(ids[:1], mask[:1], 200).completion_ids
    assert favourite not in greedy.flatten().tolist() and favourite not in sampled.flatten().tolist()
    torch.manual_seed(0)
    unsuppressed = HFGenerator(model, tokenizer, RolloutConfig(max_new_tokens=6, temperature=0.3))
    assert favourite in unsuppressed.generate(ids[:1], mask[:1], 200).completion_ids.flatten().tolist()


def test_the_fast_loop_refuses_generation_kwargs_it_cannot_honour(tiny) -> None:
    model, tokenizer, _, _ = tiny
    cfg = RolloutConfig(loop="fast", generation_kwargs={"no_repeat_ngram_size": 2})
    with pytest.raises(GrpoError, match=r"rollout.loop=fast cannot sample with rollout.generation_kwargs \(no_repeat"):
        make_generator(model, tokenizer, cfg)
    with pytest.raises(GrpoError, match="the fast loop cannot sample with rollout.generation_kwargs"):
        FastGenerator(model, tokenizer, cfg)


def test_generate_refuses_an_option_it_does_not_have(tiny) -> None:
    model, tokenizer, _, _ = tiny
    misspelt = RolloutConfig(generation_kwargs={"no_repeat_ngram_sise": 2})
    with pytest.raises(GrpoError, match="no_repeat_ngram_sise: not an option of .*did you mean no_repeat_ngram_size"):
        HFGenerator(model, tokenizer, misspelt)
    vllm_only = RolloutConfig(generation_kwargs={"presence_penalty": 0.5})  # SamplingParams', not GenerationConfig's
    with pytest.raises(GrpoError, match="presence_penalty: not an option of transformers' generate"):
        make_generator(model, tokenizer, vllm_only)


@pytest.mark.parametrize(
    ("kwargs", "owner"),
    [
        ({"temperature": 0.5}, "rollout.temperature"),
        ({"max_tokens": 9}, "rollout.max_new_tokens"),  # vLLM's name
        ({"num_return_sequences": 2}, "rollout.num_generations"),
        ({"min_p": 0.1}, "rollout.min_p"),
        ({"repetition_penalty": 1.2}, "rollout.repetition_penalty"),
        ({"eos_token_id": [3]}, "the model's EOS ids"),
    ],
)
def test_a_generation_kwarg_another_key_sets_is_refused_at_start_up(kwargs: dict, owner: str) -> None:
    key = next(iter(kwargs))
    with pytest.raises(GrpoError, match=rf"rollout.generation_kwargs.{key}=.*: set by {owner}"):
        validate_generation(ModelConfig(), DataConfig(), RolloutConfig(generation_kwargs=kwargs))


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        (RolloutConfig(min_p=1.5), r"rollout.min_p=1.5: must be in \[0, 1\]"),
        (RolloutConfig(repetition_penalty=0.0), r"rollout.repetition_penalty=0.0: must be > 0"),
    ],
)
def test_out_of_range_knobs_are_refused(rollout: RolloutConfig, message: str) -> None:
    with pytest.raises(GrpoError, match=message):
        validate_generation(ModelConfig(), DataConfig(), rollout)


# ---- vLLM ----------------------------------------------------------------------------------------


def test_vllm_sampling_params_carry_the_knobs_and_the_generation_kwargs() -> None:
    cfg = RolloutConfig(min_p=0.05, repetition_penalty=1.3, generation_kwargs={"presence_penalty": 0.5})
    sampled = sampling_params_kwargs(cfg, 4, [2], greedy=False, seed=1)
    assert (sampled["min_p"], sampled["repetition_penalty"], sampled["presence_penalty"]) == (0.05, 1.3, 0.5)
    greedy = sampling_params_kwargs(cfg, 4, [2], greedy=True, seed=None)
    # greedy keeps the penalty (a processor, as in generate) and drops the cut (argmax keeps the top token)
    assert (greedy["temperature"], greedy["min_p"], greedy["repetition_penalty"]) == (0.0, 0.0, 1.3)
    assert sampling_params_kwargs(RolloutConfig(), 4, [2], greedy=False, seed=1)["min_p"] == 0.0  # None: vLLM's off


def test_vllm_refuses_an_option_sampling_params_lacks_before_building_the_engine(tiny_model_dir: Path) -> None:
    """The SamplingParams stand-in takes only keywords of vLLM's class (a few of them): vLLM's API,
    not our code. `engine=None` would build the engine: the refusal must come first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    fields = set(sampling_params_kwargs(RolloutConfig(), 2, [2], greedy=False, seed=0))

    def sampling_params(**kwargs):
        unknown = set(kwargs) - fields
        if unknown:
            raise TypeError(f"Unexpected keyword argument {sorted(unknown)[0]!r}")
        return kwargs

    cfg = RolloutConfig(backend="vllm", generation_kwargs={"no_repeat_ngram_size": 2})
    with pytest.raises(
        GrpoError, match=r"vLLM's SamplingParams refuses rollout.generation_kwargs \(no_repeat_ngram_size\)"
    ):
        VLLMGenerator(model, tokenizer, cfg, sampling_params=sampling_params, push=lambda weights: None)
