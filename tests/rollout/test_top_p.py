"""Top-p alone cuts the sampling distribution, in the fast loop and in `generate` (issue 21 item 12:
the fast-loop distribution test also sets top-k 6, which alone satisfies its cut, so a top-p that
was ignored passed it). The expected distribution is written out here from the logits, not taken
from the warpers under test."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_cli.config.schema import ModelConfig, RolloutConfig
from grpo_cli.models import load_policy
from grpo_cli.rollout import FastGenerator, HFGenerator
from grpo_cli.rollout.prompts import PromptEncoder

TEMPERATURE, TOP_P, DRAWS = 0.2, 0.5, 6000


def nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(logits / T) kept on the most likely tokens up to the first whose cumulative
    probability reaches top_p (that one included), renormalised: the top-p rule of Holtzman et al."""
    probs = (logits / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    keep = order[: int((probs[order].cumsum(0) < top_p).sum()) + 1]
    out = torch.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


def test_top_p_alone_cuts_what_both_loops_sample(tmp_path: Path) -> None:
    model, tokenizer, _ = load_policy(
        ModelConfig(), tmp_path, seed=0, device=torch.device("cpu"), precision_dtype="fp32"
    )
    ids, mask = PromptEncoder(tokenizer, 64, torch.device("cpu"))(["12+7="])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0, -1].float()
    exact = nucleus(logits, TEMPERATURE, TOP_P)
    support = set(exact.nonzero().squeeze(1).tolist())
    assert 2 < len(support) < exact.numel() // 4  # a real cut (21 of 259 here), top-k off
    cfg = RolloutConfig(max_new_tokens=1, temperature=TEMPERATURE, top_p=TOP_P, top_k=0)
    for seed, generator in enumerate((FastGenerator(model, tokenizer, cfg), HFGenerator(model, tokenizer, cfg))):
        torch.manual_seed(seed)
        tokens = generator.generate(ids, mask, DRAWS).completion_ids[:, 0]
        assert set(tokens.unique().tolist()) <= support  # ignoring top-p would put half the draws outside
        seen = torch.bincount(tokens, minlength=exact.numel()).float() / DRAWS
        assert 0.5 * (seen - exact).abs().sum() < 0.05  # total variation; ~0.02 expected from 6000 draws
