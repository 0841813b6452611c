"""The fast loop on every family of the model zoo (tests/zoo/families.py): `rollout.loop=auto` picks it,
the log-probs it reports equal the trainer's padded forward on the ids it sampled, its greedy
completions equal `generate`'s, and a model whose cache cannot drop rows falls back to `generate`
saying why. Hybrids (linear attention, Mamba, conv) keep per-row recurrent states in their cache as
well as keys and values: a loop that repeats or drops only the keys crashes on them, or worse,
samples from another row's state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.core.logprobs import completion_logprobs_and_entropy
from grpo_cli.errors import GrpoError
from grpo_cli.models import build_tiny_tokenizer
from grpo_cli.rollout import FastGenerator, HFGenerator, make_generator
from grpo_cli.rollout.engine import fast_loop_rows
from grpo_cli.rollout.fast import probe_rows
from grpo_cli.rollout.prompts import PromptEncoder
from tests.zoo.families import FAMILIES, Family, tiny_config

PROMPTS = ["12+7=", "3+4=", "100+250="]  # different lengths: left padding in the batch
G = 3  # completions per prompt: the prompt's cache rows repeated
TEMPERATURE = 0.7
CFG = RolloutConfig(max_new_tokens=6, temperature=TEMPERATURE)
# the zoo's families whose layers the fixed-shape decode computes (rollout.fixed_decode.FAMILIES;
# mistral and olmo3 have a window shorter than a completion, so they decode through the forward)
PLAIN = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"  # as grpo_cli.models.load_tokenizer sets it
    return tokenizer


@pytest.fixture(scope="session")
def zoo(tokenizer) -> Callable[..., tuple[PreTrainedModel, FastGenerator | HFGenerator, str]]:
    """Each family's tiny fp32 model (random init, seed 0), built once in-process, and the generator
    and start-up line `make_generator` gives it under rollout.loop `loop` (its probes run once per
    family and loop): auto takes the fixed-shape decode where the family allows it, fast always
    decodes through the model's forward, dropping finished rows."""
    built: dict[str, PreTrainedModel] = {}
    generators: dict[tuple[str, str], tuple[PreTrainedModel, FastGenerator | HFGenerator, str]] = {}

    def model(family: Family, loop: str = "auto") -> tuple[PreTrainedModel, FastGenerator | HFGenerator, str]:
        if family.name not in built:
            torch.manual_seed(0)
            built[family.name] = AutoModelForCausalLM.from_config(tiny_config(family)).eval()
        if (family.name, loop) not in generators:
            net = built[family.name]
            generators[family.name, loop] = (net, *make_generator(net, tokenizer, replace(CFG, loop=loop)))
        return generators[family.name, loop]

    return model


def _prompts(tokenizer: PreTrainedTokenizerBase) -> tuple[torch.Tensor, torch.Tensor]:
    return PromptEncoder(tokenizer, 64, torch.device("cpu"))(PROMPTS)


@pytest.mark.parametrize("loop", ["auto", "fast"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_sampled_logprobs_equal_the_trainers_forward_with_rows_finished_early(family, loop, zoo, tokenizer) -> None:
    model, generator, line = zoo(family, loop)
    assert line.startswith("fast") and isinstance(generator, FastGenerator)
    # auto: the plain decoders take the fixed-shape decode (finished rows stay, masked); the others, and
    # every family under loop=fast, the model's forward with finished rows dropped from the cache
    fixed = loop == "auto" and family.name in PLAIN
    assert (line == "fast, fixed-shape decode") == fixed, line
    generator = copy.copy(generator)  # the session's generator keeps its own EOS ids
    # a quarter of the vocabulary ends a completion: rows finish at different steps and leave the cache
    generator.eos_ids = list(range(3, len(tokenizer), 4))
    ids, mask = _prompts(tokenizer)
    torch.manual_seed(0)
    # the log-probs are reported when sampling from weights that are not the policy's (the bf16 copy): an fp32 twin here
    completions, logps = generator.sample(ids, mask, G, net=copy.deepcopy(model))
    completion_mask = logps.isfinite()
    lengths = completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # some rows did stop early
    reference, _ = completion_logprobs_and_entropy(
        model,
        ids.repeat_interleave(G, dim=0),
        mask.repeat_interleave(G, dim=0),
        completions,
        completion_mask.long(),
        TEMPERATURE,
        with_entropy=False,
    )
    gap = (logps - reference)[completion_mask].abs().max()
    assert gap < 1e-4, f"{family.name}: sampler's log-probs {gap:.1e} from the trainer's forward"


@pytest.mark.parametrize("loop", ["auto", "fast"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_greedy_completions_equal_generates(family, loop, zoo, tokenizer) -> None:
    model, fast, line = zoo(family, loop)
    assert line.startswith("fast")
    slow = HFGenerator(model, tokenizer, CFG)
    ids, mask = _prompts(tokenizer)
    ours, theirs = fast.generate(ids, mask, 1, greedy=True), slow.generate(ids, mask, 1, greedy=True)
    assert torch.equal(ours.completion_ids * ours.completion_mask, theirs.completion_ids * theirs.completion_mask)
    assert ours.texts == theirs.texts


def _tiny(model_type: str, **overrides) -> PreTrainedModel:
    """A tiny random-init model of a family outside the zoo, with the byte tokenizer's vocabulary."""
    tokenizer = build_tiny_tokenizer()
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, hidden_size=64, num_hidden_layers=2, **ids, **overrides)
    return AutoModelForCausalLM.from_config(config).eval()


def _minimax(*layer_types: str) -> PreTrainedModel:
    return _tiny(
        "minimax",
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=list(layer_types),
    )


def test_the_probe_picks_the_row_operation_that_works_minimax_keeps_its_linear_states_beside_the_layers(
    tokenizer,
) -> None:
    # MiniMax's cache holds its lightning-attention states outside the layers and moves them in its
    # own batch_select_indices only: beam search's reorder_cache leaves them behind
    model = _minimax("full_attention", "linear_attention")
    assert "reorder_cache fail" in probe_rows(model, "reorder_cache")
    assert fast_loop_rows(model) == ("batch_select_indices", None)
    generator, line = make_generator(model, tokenizer, CFG)
    assert line.startswith("fast") and generator.row_operation == "batch_select_indices"
    generator.eos_ids = list(range(3, len(tokenizer), 4))
    ids, mask = _prompts(tokenizer)
    torch.manual_seed(0)
    completions, logps = generator.sample(ids, mask, G, net=copy.deepcopy(model))
    completion_mask = logps.isfinite()
    reference, _ = completion_logprobs_and_entropy(
        model,
        ids.repeat_interleave(G, 0),
        mask.repeat_interleave(G, 0),
        completions,
        completion_mask.long(),
        TEMPERATURE,
        with_entropy=False,
    )
    assert (logps - reference)[completion_mask].abs().max() < 1e-4


def test_a_cache_that_cannot_drop_rows_falls_back_to_generate_with_the_reason_in_the_line(tokenizer) -> None:
    # MiniMax-Text-01's last layer is full attention: its cache's batch_select_indices then indexes
    # past its list of linear states (IndexError), and reorder_cache leaves them behind
    model = _minimax("linear_attention", "full_attention")
    generator, line = make_generator(model, tokenizer, CFG)
    assert isinstance(generator, HFGenerator)
    assert line.startswith("generate (its cache's rows taken by reorder_cache fail (RuntimeError: The size of tensor")
    assert "its cache's rows taken by batch_select_indices fail (IndexError" in line
    with pytest.raises(GrpoError, match="rollout.loop=fast cannot drive this model: its cache's rows taken by"):
        make_generator(model, tokenizer, RolloutConfig(loop="fast"))


def test_a_model_the_loop_cannot_decode_falls_back_to_generate_with_the_reason_in_the_line(tokenizer) -> None:
    # Mamba's forward reads the attention mask as one entry per input token (generate passes none
    # after the prefill): the loop's full-length mask at a one-token step spreads the token over the
    # context. Its cache has reorder_cache and batch_* methods, which a check of methods would trust
    model = _tiny("mamba")
    generator, line = make_generator(model, tokenizer, CFG)
    assert isinstance(generator, HFGenerator)
    assert line.startswith("generate (its cached decoding, rows repeated and dropped by reorder_cache, gives logits")
    assert "away from a fresh forward's" in line and "batch_select_indices" in line
