"""The packed layout on every family of the zoo: where it is offered, its per-token log-probs,
entropies, loss and gradients equal the padded layout's (sliding windows, chunked attention, latent
attention and experts included); where it is not (layers that carry a state from token to token),
the reason names those layers, `auto` trains padded and `packed` is refused in one line. And the
router's auxiliary loss of mixture-of-experts models, with TRL's coefficient semantics."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import AlgoConfig
from grpo_cli.core.logprobs import (
    completion_logprobs_and_entropy,
    packed_completion_logprobs_and_entropy,
    packed_unsupported,
    padded_pass,
    rows_logprobs,
)
from grpo_cli.core.packing import FULL_ATTENTION, attention_pattern, pack, prompt_groups
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, policy_update
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Rollout
from grpo_cli.training.layout import router_aux_coefficient, training_layout
from tests.zoo.families import FAMILIES, WINDOW, Family, tiny_config

G, PROMPT, COMPLETION = 3, 6, 3 * WINDOW  # completions three windows long: every window and chunk is crossed
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
STATEFUL = {"linear-attention hybrid", "conv hybrid", "mamba hybrid"}


def model_of(family: Family) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family)).eval()


def rows() -> Rollout:
    """Two prompts of different lengths (left padding), G completions each, ending at varied lengths."""
    generator = torch.Generator().manual_seed(1)
    prompt_mask = torch.ones(2, PROMPT, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_ids = torch.randint(3, 250, (2, PROMPT), generator=generator) * prompt_mask
    completion_ids = torch.randint(3, 250, (2 * G, COMPLETION), generator=generator)
    completion_mask = torch.ones(2 * G, COMPLETION, dtype=torch.long)
    for row, length in enumerate([COMPLETION, 7, 2, COMPLETION - 1, COMPLETION, 5]):
        completion_mask[row, length:] = 0
    completion_ids = completion_ids * completion_mask
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
    truncated = completion_mask[:, -1].bool()
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, [""] * 2 * G, G)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_packed_equals_padded_wherever_it_is_offered(family: Family) -> None:
    model, batch = model_of(family), rows()
    reason = packed_unsupported(model)
    if family.kind in STATEFUL:
        assert reason is not None and "carry a state from token to token" in reason, reason
        return
    assert reason is None, reason
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    groups = prompt_groups(batch.prompt_ids, batch.prompt_mask)
    weights = torch.randn(batch.completion_ids.shape, generator=torch.Generator().manual_seed(2))
    results = []
    for layout in ("padded", "packed"):
        model.zero_grad()
        if layout == "padded":
            logps, entropies = completion_logprobs_and_entropy(model, *args, 0.7)
        else:
            logps, entropies = packed_completion_logprobs_and_entropy(model, *args, groups, 0.7)
        mask = batch.completion_mask
        loss = (logps * mask * weights).sum() - 0.1 * (entropies * mask).sum()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((logps * mask, entropies * mask, loss.detach(), grads))
    (lp_pad, h_pad, loss_pad, g_pad), (lp_pack, h_pack, loss_pack, g_pack) = results
    torch.testing.assert_close(lp_pack, lp_pad, **TIGHT)
    torch.testing.assert_close(h_pack, h_pad, **TIGHT)
    torch.testing.assert_close(loss_pack, loss_pad, **TIGHT)
    scale = max(g.abs().max().item() for g in g_pad)
    assert len(g_pack) == len(g_pad)
    for packed, padded in zip(g_pack, g_pad):
        torch.testing.assert_close(packed, padded, atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("name", ["gemma3_text", "mistral", "gpt_oss", "llama4_text"])
def test_a_packed_mask_that_ignored_the_window_would_train_another_model(name: str) -> None:
    """The equality above is not vacuous: the zoo's windows and chunks are shorter than its
    completions, so the mask of full attention (what packing built before it read layer_types) gives
    other log-probs than the model computes."""
    family = next(f for f in FAMILIES if f.name == name)
    model, batch = model_of(family), rows()
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    padded, _ = completion_logprobs_and_entropy(model, *args)
    groups = prompt_groups(batch.prompt_ids, batch.prompt_mask)
    for pattern, close in ((attention_pattern(model.config), True), (FULL_ATTENTION, False)):
        packed = pack(*args, groups, torch.float32, pattern)
        logits = model(
            input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids
        ).logits
        picked = logits[packed.source_row, packed.source_position].log_softmax(-1)
        logps = picked.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) * batch.completion_mask
        gap = (logps - padded * batch.completion_mask).abs().max().item()
        assert (gap < 1e-5) == close, f"{pattern}: {gap}"


@pytest.mark.parametrize("name", ["qwen3_5_text", "nemotron_h", "lfm2"])
def test_a_stateful_family_trains_padded_under_auto_and_refuses_packed(name: str) -> None:
    family = next(f for f in FAMILIES if f.name == name)
    model, batch = model_of(family), rows()
    layout, words = training_layout("auto", model, 0.0)
    assert layout == "padded" and words.startswith("padded (its ") and "layers carry a state" in words
    with pytest.raises(GrpoError, match="^train.layout=packed cannot train this model: its .* layers carry a state"):
        training_layout("packed", model, 0.0)
    everything = torch.arange(2 * G)
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    auto, _ = rows_logprobs(model, batch, everything, 1.0, "auto", with_entropy=False)
    padded, _ = completion_logprobs_and_entropy(model, *args, with_entropy=False)
    torch.testing.assert_close(auto, padded, atol=0, rtol=0)


def test_an_attention_family_offers_packed_and_says_so() -> None:
    model = model_of(next(f for f in FAMILIES if f.name == "gemma3_text"))
    assert training_layout("auto", model, 0.0) == ("auto", "auto: packed where it costs less than padded")
    assert training_layout("packed", model, 0.0) == ("packed", "packed")
    assert training_layout("padded", model, 0.0) == ("padded", "padded (train.layout=padded)")


def test_the_router_coefficient_is_resolved_as_trl_resolves_it() -> None:
    moe = model_of(next(f for f in FAMILIES if f.name == "qwen3_moe"))
    dense = model_of(next(f for f in FAMILIES if f.name == "qwen3"))
    latent = model_of(next(f for f in FAMILIES if f.name == "deepseek_v3"))
    assert moe.config.router_aux_loss_coef > 0
    assert router_aux_coefficient(None, moe) == pytest.approx(moe.config.router_aux_loss_coef)
    assert router_aux_coefficient(0.0, moe) == 0.0
    assert router_aux_coefficient(0.5, moe) == 0.5
    assert router_aux_coefficient(None, dense) == 0.0
    assert router_aux_coefficient(None, latent) == 0.0  # DeepSeek-V3 balances its experts without a loss
    with pytest.raises(GrpoError, match=r"^algo.router_aux_loss_coef=0.5: Qwen3ForCausalLM is not a mixture-of-expe"):
        router_aux_coefficient(0.5, dense)
    layout, words = training_layout("auto", moe, 0.01)
    assert layout == "padded" and "algo.router_aux_loss_coef=0.01" in words


def test_the_router_loss_adds_coef_times_the_models_own_aux_loss_to_the_update() -> None:
    """One policy update with the router's loss on against one without: the gradients differ by
    coef·d(aux)/dθ, the model's own load-balancing loss over the padded rows, and the figure is logged."""
    base, batch = model_of(next(f for f in FAMILIES if f.name == "qwen3_moe")), rows()
    advantages = torch.randn(2 * G, generator=torch.Generator().manual_seed(3))
    coef, grads, reported = 0.5, [], []
    for aux in (0.0, coef):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradients are what is compared
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        captured: list[list[torch.Tensor]] = []
        hook = optimizer.register_step_pre_hook(
            lambda opt, *_, into=captured, net=model: into.append([p.grad.clone() for p in net.parameters()])
        )
        stats = policy_update(
            Learner(model, optimizer, scheduler),
            UpdateBatch(batch, advantages, batch.completion_mask),
            AlgoConfig(),
            UpdateSettings(1.0, COMPLETION, 2, 0.0, "padded", aux),
        )
        hook.remove()
        grads.append(captured[0])
        reported.append(stats.variants.get("router/aux_loss"))
    assert reported[0] is None
    model = copy.deepcopy(base)
    model.zero_grad()
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    halves = torch.arange(2 * G).tensor_split(2)  # grad_accum 2: TRL's mean over the micro-batches
    aux_losses = [padded_pass(model, *(a[h] for a in args), router_aux=True).aux_loss for h in halves]
    (coef * torch.stack(aux_losses).mean()).backward()
    for without, with_aux, p in zip(grads[0], grads[1], model.parameters()):
        expected = p.grad if p.grad is not None else torch.zeros_like(without)
        torch.testing.assert_close(with_aux - without, expected, atol=1e-6, rtol=1e-4)
    assert reported[1] == pytest.approx(
        sum(a.item() * batch.completion_mask[h].sum().item() for a, h in zip(aux_losses, halves))
        / batch.completion_mask.sum().item()
    )
