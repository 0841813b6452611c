"""A real tiny model and a real sampled rollout, shared by the update and precision tests."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import HFGenerator, Rollout
from grpo_cli.rollout.prompts import PromptEncoder

G, PROMPTS, NEW = 4, 6, 6


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.train()
    return model


@pytest.fixture(scope="module")
def rollout(base_model, tiny_model_dir) -> Rollout:
    tokenizer = load_tokenizer(tiny_model_dir)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    ids, mask = encoder([f"{a}+{a + 1}=" for a in range(PROMPTS)])
    torch.manual_seed(0)
    out = HFGenerator(base_model, tokenizer, RolloutConfig(max_new_tokens=NEW)).generate(ids, mask, G)
    assert out.completion_mask.sum(-1).min() >= 1
    return out


def advantages_for(rollout: Rollout, seed: int = 0) -> torch.Tensor:
    return torch.randn(rollout.completion_ids.size(0), generator=torch.Generator().manual_seed(seed))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
