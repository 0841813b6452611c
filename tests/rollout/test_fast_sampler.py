"""The fast loop's draw at a real vocabulary size, and what it does with NaN probabilities.

Sampling cannot see a 1e-3 total variation spread over 150k tokens, so the distributions here are
built so that a sampler with 24 bits of resolution (a float32 CDF or a float32 uniform) gives a
whole class of tokens an empty interval: the draws then miss a mass the test can count.
"""

from __future__ import annotations

import pytest
import torch

from grpo_cli.config.schema import ModelConfig, RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator
from grpo_cli.rollout.fast import sample_categorical
from grpo_cli.rollout.prompts import PromptEncoder

VOCAB = 150_000
ULP = 2.0**-24  # float32's spacing just below 1


def peaked_with_tiny_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """A token of mass 0.991 first, then pairs (2 ulps - tiny, tiny): every cumulative sum after a
    pair sits on float32's grid, and each tiny token (2.5e-8, under half an ulp) is the last stretch
    below a grid point. Exact sampling draws the tiny tokens 1.9e-3 of the time; 24 bits, never."""
    pairs = (VOCAB - 1) // 2
    probs = torch.empty(VOCAB, dtype=torch.float32)
    probs[0] = 1.0 - pairs * 2 * ULP  # exact in float32: the grid starts here
    probs[1::2] = 2 * ULP - 2.5e-8
    probs[2::2] = 2.5e-8
    tiny = torch.zeros(VOCAB, dtype=torch.bool)
    tiny[2::2] = True
    return probs, tiny


def draws(probs: torch.Tensor, n: int, chunk: int = 100) -> torch.Tensor:
    """`n` draws of `sample_categorical` from one distribution, `chunk` rows at a time."""
    return torch.cat([sample_categorical(probs.expand(chunk, -1)) for _ in range(n // chunk)])


def test_tiny_tokens_after_a_peak_stay_drawable_at_a_150k_vocabulary() -> None:
    probs, tiny = peaked_with_tiny_tokens()
    exact = probs.double() / probs.double().sum()
    tiny_mass = float(exact[tiny].sum())
    assert 1.8e-3 < tiny_mass < 2e-3
    torch.manual_seed(0)
    tokens = draws(probs, 6000)
    hits = tokens[tiny[tokens]]
    # 6000 x 1.9e-3 = 11 expected (a float32 CDF or uniform: 0); 3..25 holds but for 1e-3
    assert 3 <= hits.numel() <= 25, hits.numel()
    assert (hits < VOCAB // 2).any() and (hits >= VOCAB // 2).any()  # across the vocabulary, not one stretch
    assert int((tokens == 0).sum()) > 5850  # the peak is still the peak


def test_the_draws_follow_a_150k_vocabulary_with_cut_tokens_never_drawn() -> None:
    torch.manual_seed(1)
    logits = torch.randn(VOCAB) * 2
    logits[torch.randperm(VOCAB)[: VOCAB // 2]] = -float("inf")  # as top-k/top-p leave it: half the vocabulary cut
    probs = logits.softmax(-1)
    tokens = draws(probs, 1000)
    assert bool((probs[tokens] > 0).all())
    # the mass in 10 bins of equal probability: 1000 draws put 100 +- 10 in each
    order = probs.double().argsort()
    bins = torch.empty(VOCAB, dtype=torch.long)
    bins[order] = (probs.double()[order].cumsum(0) * 10).long().clamp(max=9)
    seen = torch.bincount(bins[tokens], minlength=10).double() / tokens.numel()
    expected = torch.zeros(10, dtype=torch.float64).index_add_(0, bins, probs.double())
    assert float(0.5 * (seen - expected).abs().sum()) < 0.1  # ~0.04 from 1000 draws; argmax: 0.9


def test_nan_probabilities_stop_the_loop_naming_the_token_and_the_row(tmp_path) -> None:
    model, tokenizer, _ = load_policy(
        ModelConfig(), tmp_path, seed=0, device=torch.device("cpu"), precision_dtype="fp32"
    )
    ids, mask = PromptEncoder(tokenizer, 64, torch.device("cpu"))(["12+7=", "3+4="])
    fast = FastGenerator(model, tokenizer, RolloutConfig(max_new_tokens=4))
    with torch.no_grad():
        model.lm_head.weight[5].fill_(float("nan"))  # one vocabulary row: every position's logits are NaN
    with pytest.raises(GrpoError, match=r"NaN next-token probabilities at token 1 of completion row 0 \(prompt 0"):
        fast.generate(ids, mask, 2)
    with pytest.raises(GrpoError, match=r"NaN next-token logits at token 1 of completion row 0"):
        fast.generate(ids, mask, 2, greedy=True)
