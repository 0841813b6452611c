"""GRPOTrainer.learn on a real rollout of the tiny model (issue 21 item 12): what the trainer hands
the update. Log-probs at rollout.temperature, unscorable rows out of the loss denominators, and
algo.mask_truncated taking truncated completions out of the loss."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.core.logprobs import completion_logprobs_and_entropy
from grpo_cli.rollout import Rollout
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups

G = 4
UNSCORABLE_FIRST = "tests.training.row_rewards:unscorable_first_prompt"


def config(**rollout) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, 4, G
    cfg.data.num_examples = 50
    cfg.optim.warmup_steps = 0  # the first step moves the weights
    for key, value in rollout.items():
        setattr(cfg.rollout, key, value)
    return cfg


def ready(cfg: TrainConfig, run_dir: Path) -> GRPOTrainer:
    trainer = GRPOTrainer(cfg, run_dir)
    trainer.setup()
    return trainer


def sample(trainer: GRPOTrainer) -> tuple[list[dict], Rollout]:
    """What step() does before learn(): the step's prompts and their groups."""
    batch = trainer.sampler.next_batch(trainer.cfg.train.prompts_per_step)
    return batch, generate_groups(batch, trainer.encoder, trainer.generator, G)


def weights(trainer: GRPOTrainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])


def test_the_update_scores_log_probs_at_the_rollout_temperature(tmp_path: Path) -> None:
    """The logged entropy comes from the update's own pass: at temperature 0.1 it is the entropy of
    softmax(logits / 0.1) over the completion tokens (0.33 nats here), far from the entropy at 1 (5.5)."""
    trainer = ready(config(temperature=0.1), tmp_path)
    batch, rollout = sample(trainer)
    entropy = {}
    with torch.no_grad():
        for temperature in (0.1, 1.0):
            _, per_token = completion_logprobs_and_entropy(
                trainer.model,
                rollout.prompt_ids,
                rollout.prompt_mask,
                rollout.completion_ids,
                rollout.completion_mask,
                temperature,
            )
            mask = rollout.completion_mask.float()
            entropy[temperature] = ((per_token * mask).sum() / mask.sum()).item()
    result = trainer.learn(batch, rollout, time.perf_counter())
    trainer.cleanup()
    assert entropy[0.1] < 0.9 * entropy[1.0]
    assert result.metrics["entropy"] == pytest.approx(entropy[0.1], rel=1e-4)


def test_unscorable_rows_count_in_no_loss_denominator(tmp_path: Path) -> None:
    """A group no function can score updates the policy exactly as a batch without that group:
    the same loss and gradient norm (the grpo loss's sequence count leaves the unscorable rows out)."""
    cfg = config()
    cfg.reward.functions = [RewardFunctionConfig(name="chars", target=UNSCORABLE_FIRST)]
    with_group = ready(cfg, tmp_path / "with")
    batch, rollout = sample(with_group)
    full = with_group.learn(batch, rollout, time.perf_counter()).metrics
    with_group.cleanup()
    assert full["frac_unscorable"] == 1 / len(batch)

    cfg.reward.functions[0].kwargs = {"unscorable": False}  # the same scores, no group left unscored
    without = ready(cfg, tmp_path / "without")
    rows = torch.arange(G, len(batch) * G)  # every group but the first
    rest = rollout.select(rows, group_size=G)
    smaller = without.learn(batch[1:], rest, time.perf_counter()).metrics
    without.cleanup()
    assert smaller["frac_unscorable"] == 0 and smaller["grad_norm"] > 0
    assert full["grad_norm"] == pytest.approx(smaller["grad_norm"], rel=1e-4)
    assert full["loss"] == pytest.approx(smaller["loss"], rel=1e-4, abs=1e-7)


def test_mask_truncated_takes_truncated_completions_out_of_the_loss(tmp_path: Path) -> None:
    """min_new_tokens = max_new_tokens: every completion runs to the limit, none ends on EOS. With
    algo.mask_truncated nothing is left in the loss: no gradient, the weights stay where they were."""
    grads = {}
    for masked in (True, False):
        cfg = config(max_new_tokens=4, min_new_tokens=4)
        cfg.algo.mask_truncated = masked
        trainer = ready(cfg, tmp_path / str(masked))
        before = weights(trainer)
        batch, rollout = sample(trainer)
        metrics = trainer.learn(batch, rollout, time.perf_counter()).metrics
        assert metrics["frac_truncated"] == 1.0 and metrics["optimizer_steps"] == 1
        grads[masked] = metrics["grad_norm"]
        moved = not torch.equal(before, weights(trainer))
        trainer.cleanup()
        assert moved is not masked
    assert grads[True] == 0.0 < grads[False]
