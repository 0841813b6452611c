"""Completion log-probs: the chunked logsumexp path against the plain full-vocabulary log_softmax.

With the tiny real model: a padded batch (left-padded prompts of different lengths, right-padded
completions) gives, on every real completion token, the log-probs and gradients of each sequence
run alone and unpadded through the model with `log_softmax(logits / T)`.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.core.logprobs import completion_logprobs_and_entropy, token_logprobs, token_logprobs_and_entropy

T = 0.7
PROMPT_LENGTHS = [5, 2, 4, 1]
COMPLETION_LENGTHS = [3, 6, 1, 4]
PAD = 256  # <pad> of the tiny byte tokenizer; any id works under a zero mask


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    m.eval()  # no dropout: both paths must compute the same function
    return m


@pytest.fixture(scope="module")
def batch():
    """Left-padded prompts, right-padded completions, and the unpadded sequences they hold."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in PROMPT_LENGTHS]
    completions = [torch.randint(0, 256, (n,), generator=gen) for n in COMPLETION_LENGTHS]
    p, c = max(PROMPT_LENGTHS), max(COMPLETION_LENGTHS)
    b = len(prompts)
    prompt_ids = torch.full((b, p), PAD)
    prompt_mask = torch.zeros(b, p, dtype=torch.long)
    completion_ids = torch.full((b, c), PAD)
    completion_mask = torch.zeros(b, c, dtype=torch.long)
    for i, (x, y) in enumerate(zip(prompts, completions)):
        prompt_ids[i, p - len(x) :], prompt_mask[i, p - len(x) :] = x, 1
        completion_ids[i, : len(y)], completion_mask[i, : len(y)] = y, 1
    return prompts, completions, (prompt_ids, prompt_mask, completion_ids, completion_mask)


def naive_logprobs(model, prompt: torch.Tensor, completion: torch.Tensor) -> torch.Tensor:
    """One sequence, no padding, no mask: the textbook log_softmax over the whole vocabulary."""
    logits = model(input_ids=torch.cat([prompt, completion]).unsqueeze(0), use_cache=False).logits[0]
    predicting = logits[len(prompt) - 1 : -1].float() / T  # position t predicts token t + 1
    return predicting.log_softmax(-1).gather(1, completion.unsqueeze(1)).squeeze(1)


def test_padded_batch_matches_each_sequence_alone(model, batch) -> None:
    prompts, completions, tensors = batch
    with torch.no_grad():
        batched, _ = completion_logprobs_and_entropy(model, *tensors, temperature=T, with_entropy=False)
        assert batched.dtype == torch.float32 and batched.shape == tensors[2].shape
        for i, (x, y) in enumerate(zip(prompts, completions)):
            torch.testing.assert_close(batched[i, : len(y)], naive_logprobs(model, x, y), atol=1e-6, rtol=0)


def test_gradients_match_the_naive_path(model, batch) -> None:
    prompts, completions, tensors = batch
    completion_mask = tensors[3]
    # the embedding is tied to the output head: its gradient goes through both ends of the model
    param = model.get_input_embeddings().weight

    model.zero_grad()
    logps, _ = completion_logprobs_and_entropy(model, *tensors, temperature=T, with_entropy=False)
    (logps * completion_mask).sum().backward()
    chunked = param.grad.clone()

    model.zero_grad()
    sum(naive_logprobs(model, x, y).sum() for x, y in zip(prompts, completions)).backward()
    naive = param.grad.clone()
    model.zero_grad()

    assert naive.abs().max() > 0
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_helper_matches_log_softmax_and_gather(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(3, 5, 50, generator=gen)).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (3, 5), generator=gen)
    weights = torch.randn(3, 5, generator=gen)  # a loss that is not a plain sum

    ours = token_logprobs(logits, ids, temperature=T, chunk_rows=4)  # 15 rows: chunks of 4, 4, 4, 3
    (ours * weights).sum().backward()
    ours_grad, logits.grad = logits.grad, None

    reference = (logits.float() / T).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (reference * weights).sum().backward()

    assert ours.dtype == torch.float32 and ours.shape == ids.shape
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-6)  # log-probs near -20
    assert ours_grad.dtype == dtype
    torch.testing.assert_close(ours_grad, logits.grad, atol=1e-6, rtol=0)


def test_entropy_of_known_distributions():
    """Uniform over V: ln V. (1/2, 1/4, 1/4): 1.5 bits. Temperature 2 flattens towards uniform."""
    logits = torch.stack([torch.zeros(8), torch.log(torch.tensor([0.5, 0.25, 0.25] + [1e-12] * 5))])
    logps, entropy = token_logprobs_and_entropy(logits, torch.tensor([3, 0]), chunk_rows=1)
    assert entropy.tolist() == pytest.approx([math.log(8), 1.5 * math.log(2)], abs=1e-5)
    assert logps.tolist() == pytest.approx([-math.log(8), math.log(0.5)], abs=1e-5)
    _, hot = token_logprobs_and_entropy(logits[1:], torch.tensor([0]), temperature=2.0)
    p = torch.softmax(logits[1] / 2.0, -1)
    assert hot.item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)
