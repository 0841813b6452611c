"""Padding-free training passes against the padded ones on the tiny model (loaded through
`from_pretrained`), on rollouts whose completions end at different lengths: the same log-probs,
entropies, gradients and updates, micro-batches that split a group included; and the layout rule."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, ModelConfig, RolloutConfig
from grpo_cli.core.logprobs import completion_logprobs_and_entropy, packed_completion_logprobs_and_entropy
from grpo_cli.core.packing import choose_layout, pack, prompt_groups, token_counts
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, policy_update
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator
from grpo_cli.rollout.prompts import PromptEncoder

G = 4
TIGHT = {"atol": 1e-6, "rtol": 1e-6}  # a few float32 ulps: the packed matmuls are shaped differently


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    model, tokenizer, _ = load_policy(
        ModelConfig(), tmp_path_factory.mktemp("tiny"), seed=0, device=torch.device("cpu"), precision_dtype="fp32"
    )
    torch.manual_seed(0)
    with torch.no_grad():  # the random init answers "=" to everything; shaken, it stops at varied lengths
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    ids, mask = PromptEncoder(tokenizer, 64, torch.device("cpu"))(["12+7=", "3+4=", "100+250=", "9+9="])
    generator = FastGenerator(model, tokenizer, RolloutConfig(max_new_tokens=8))
    generator.eos_ids = list(range(48, 58))  # ten of the byte tokens end a completion: lengths vary in a group
    torch.manual_seed(3)
    rollout = generator.generate(ids, mask, G)
    assert len(set(rollout.lengths.tolist())) > 2
    return model, rollout


def _passes(model, rollout, rows):
    r = rollout
    args = (r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows], r.completion_mask[rows])
    padded = completion_logprobs_and_entropy(model, *args, 0.7)
    packed = packed_completion_logprobs_and_entropy(model, *args, rows // G, 0.7)
    return padded, packed


@pytest.mark.parametrize("rows", [torch.arange(16), torch.tensor([1, 2, 3, 4, 5, 9])], ids=["all", "split-groups"])
def test_packed_log_probs_and_entropies_equal_the_padded_pass(setup, rows) -> None:
    model, rollout = setup
    (lp_pad, h_pad), (lp_pack, h_pack) = _passes(model, rollout, rows)
    mask = rollout.completion_mask[rows]
    torch.testing.assert_close(lp_pack * mask, lp_pad * mask, **TIGHT)
    torch.testing.assert_close(h_pack * mask, h_pad * mask, **TIGHT)


def test_packed_gradients_equal_the_padded_pass(setup) -> None:
    model, rollout = setup
    rows = torch.arange(16)
    weights = torch.randn(rollout.completion_ids.shape, generator=torch.Generator().manual_seed(0))
    grads = []
    for index in (0, 1):
        model.zero_grad()
        logps = _passes(model, rollout, rows)[index][0]
        (logps * rollout.completion_mask * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    # 1e-6 of the largest gradient: the log-softmax layer runs in float32 and the packed pass sums the
    # gradients of the positions a group's completions share in another order (measured: 3e-7 of it)
    scale = max(g.abs().max().item() for g in grads[0])
    for padded, packed in zip(*grads):
        torch.testing.assert_close(packed, padded, atol=1e-6 * scale, rtol=0)


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_a_policy_update_is_the_same_in_both_layouts(setup, grad_accum) -> None:
    base, rollout = setup
    advantages = torch.randn(16, generator=torch.Generator().manual_seed(1))
    algo = AlgoConfig(beta=0.04)
    results = []
    for layout in ("padded", "packed"):
        model = copy.deepcopy(base)
        # SGD: Adam's first step is lr·sign(g) where |g| is tiny, which turns float rounding into whole steps
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        torch.manual_seed(5)
        settings = UpdateSettings(0.7, 8, grad_accum, 1.0, layout)
        stats = policy_update(
            Learner(model, optimizer, scheduler, base),
            UpdateBatch(rollout, advantages, rollout.completion_mask),
            algo,
            settings,
        )
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (padded, padded_weights), (packed, packed_weights) = results
    assert packed.loss == pytest.approx(padded.loss, abs=1e-6)
    assert packed.grad_norm == pytest.approx(padded.grad_norm, rel=1e-5)
    assert packed.kl == pytest.approx(padded.kl, abs=1e-6)
    for a, b in zip(packed_weights, padded_weights):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_packing_counts_each_prompt_once_and_only_real_tokens(setup) -> None:
    _, rollout = setup
    padded, packed = token_counts(rollout.prompt_mask, rollout.completion_mask, torch.arange(16) // G)
    prompts = sum(rollout.prompt_mask[g * G].sum().item() for g in range(4))
    assert padded == 16 * (rollout.prompt_ids.size(1) + rollout.completion_ids.size(1))
    assert packed == prompts + rollout.completion_mask.sum().item()


def test_auto_packs_short_groups_and_keeps_padding_where_attention_would_cost_more() -> None:
    groups = torch.arange(64) // 8
    prompt, completion = torch.ones(64, 8, dtype=torch.long), torch.ones(64, 4, dtype=torch.long)
    assert choose_layout("auto", prompt, completion, groups, hidden_size=64) == "packed"  # the tiny default
    long = torch.ones(64, 2048, dtype=torch.long)  # 8 x 2048 tokens in one row: attention dominates
    assert choose_layout("auto", prompt, long, groups, hidden_size=64) == "padded"
    assert choose_layout("padded", prompt, completion, groups, hidden_size=64) == "padded"


def test_pack_refuses_rows_that_claim_a_prompt_they_do_not_share(setup) -> None:
    """Packed, a group's rows are computed after its first row's prompt: rows whose prompts differ (an
    environment's reset added text to each) are refused, and `prompt_groups` never puts them together."""
    _, rollout = setup
    rows = torch.tensor([0, 1, 4])  # two rows of the first prompt and one of the second
    r = rollout
    args = (r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows], r.completion_mask[rows])
    with pytest.raises(ValueError, match="different prompts"):
        pack(*args, torch.tensor([0, 0, 0]), torch.float32)
    assert prompt_groups(args[0], args[1]).tolist() == [0, 0, 1]
    assert torch.equal(prompt_groups(r.prompt_ids, r.prompt_mask), torch.arange(16) // G)
