"""A local sequence-classification reward model scored through the plain reward signature."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForSequenceClassification

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import build_tiny_tokenizer
from grpo_cli.rewards import RewardModelScorer, resolve_reward_sources


def save_tiny_reward_model(directory: Path, with_pad_token: bool = True) -> Path:
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id if with_pad_token else None,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(directory)
    if not with_pad_token:
        tokenizer.pad_token = None
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "model")


def single_score(scorer: RewardModelScorer, text: str, add_special_tokens: bool = True) -> float:
    """The reference: one unpadded sequence through the model."""
    enc = scorer.tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens)
    with torch.no_grad():
        return scorer.model(**enc).logits[0, 0].item()


def test_scores_match_unpadded_single_sequences_across_batches(model_dir):
    """Batch size 2 over 3 samples of different lengths: padding must not change a score."""
    scorer = RewardModelScorer(model_dir, device="cpu", batch_size=2)
    prompts = ["1+1=", "2+2=", "10+10="]
    completions = ["2", "four, surely", "20"]
    scores = scorer(prompts, completions, answer=["2", "4", "20"])
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores)
    expected = [single_score(scorer, p + c) for p, c in zip(prompts, completions)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == 3  # a random head still tells them apart


def test_conversational_prompt_goes_through_the_chat_template(model_dir):
    scorer = RewardModelScorer(model_dir, device="cpu", batch_size=4)
    prompt = [{"role": "user", "content": "1+1="}]
    (score,) = scorer([prompt], ["2"])
    text = scorer.tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": "2"}], tokenize=False)
    assert text == "user: 1+1=\nassistant: 2\n"
    assert score == pytest.approx(single_score(scorer, text, add_special_tokens=False), abs=1e-5)


def test_missing_pad_token_falls_back_to_eos(tmp_path):
    scorer = RewardModelScorer(save_tiny_reward_model(tmp_path / "nopad", with_pad_token=False), "cpu", 2)
    assert scorer.tokenizer.pad_token == scorer.tokenizer.eos_token == "</s>"
    assert scorer.model.config.pad_token_id == scorer.tokenizer.eos_token_id
    assert len(scorer(["a", "bcd"], ["x", "y"])) == 2


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(GrpoError, match=f"reward model '{tmp_path / 'nowhere'}'"):
        RewardModelScorer(tmp_path / "nowhere", "cpu", 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(GrpoError, match=f"reward model '{tmp_path / 'empty'}': cannot load"):
        RewardModelScorer(tmp_path / "empty", "cpu", 2)


def test_spec_with_model_path_resolves_to_a_scorer(model_dir):
    spec = RewardFunctionConfig(
        name="rm", weight=0.5, model_path=str(model_dir), device="cpu", batch_size=3, parallel=True
    )
    (source,) = resolve_reward_sources([spec])
    assert isinstance(source.fn, RewardModelScorer) and source.fn.batch_size == 3
    assert source.normalize == "zscore"  # unset: reward model logits are unbounded
    assert not source.parallel  # a model stays in the process that loaded it
    assert len(source.fn(["q"], ["a"])) == 1


def test_a_reward_model_composed_like_the_cli_is_z_scored_by_default(model_dir):
    """`normalize` left unset in YAML or on the command line must reach the source as unset."""
    user = {
        "reward": {"functions": [{"name": "rm", "model_path": str(model_dir)}, {"name": "em", "target": "exact_match"}]}
    }
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), user))
    assert [fn.normalize for fn in cfg.reward.functions] == [None, None]
    rm, em = resolve_reward_sources(cfg.reward.functions, device="cpu")
    assert (rm.normalize, em.normalize) == ("zscore", "none")
