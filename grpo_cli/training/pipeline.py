"""The stages a training step and an evaluation share: prompts -> G completions -> fused rewards."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_cli.config.schema import DataConfig, EnvConfig, ModelConfig, RolloutConfig, SandboxConfig, TrainConfig
from grpo_cli.data import split_examples
from grpo_cli.environments import longest_prompt
from grpo_cli.errors import GrpoError
from grpo_cli.evaluation import ScoredSamples, SuccessRule, greedy_answers, sample_metrics
from grpo_cli.models import load_policy
from grpo_cli.rewards import BatchScores, FusionResult, RewardBatch, RewardExecutor, RewardFusion, score_batch
from grpo_cli.rewards.scoring import with_environment_columns
from grpo_cli.rewards.trl_style import multi_turn_columns
from grpo_cli.rollout import Generator, Rollout, make_generator
from grpo_cli.rollout.episodes import EpisodeGenerator, with_environment
from grpo_cli.rollout.fast import FastGenerator
from grpo_cli.rollout.prompts import PromptBudget, PromptEncoder, context_length, fit_prompts
from grpo_cli.rollout.sampling_copy import SamplingCopy, sampling_weights_choice
from grpo_cli.rollout.vllm import VLLMGenerator
from grpo_cli.rollout.vllm_server import VLLMServerGenerator


def select_split(examples: list[dict[str, Any]], split: str, data: DataConfig) -> list[dict[str, Any]]:
    """`all`, or the trainer's own `train`/`eval` side of `data.eval_fraction` (same seed, same rows)."""
    if split == "all":
        return examples
    train, held_out = split_examples(examples, data.eval_fraction, data.seed)
    return train if split == "train" else held_out


@dataclass
class SamplingModel:
    """A model ready to sample a split's prompts: what `grpo rollout` and `grpo eval` load."""

    model_dir: Path  # the starting model's directory
    encoder: PromptEncoder
    generator: Generator
    examples: list[dict[str, Any]]  # the split's prompts fitted to the context, at most max_prompts
    budget: PromptBudget
    loop: str  # which sampling loop runs, and why not the fast one when it is not


def load_sampling_model(
    model: ModelConfig,
    data: DataConfig,
    rollout: RolloutConfig,
    split: str,
    examples: list[dict[str, Any]],
    max_prompts: int,
    run_dir: Path,
    seed: int,
    device: torch.device,
    dtype: str,
    env: EnvConfig,
    sandbox: SandboxConfig,
) -> SamplingModel:
    """Load the model and fit the prompts to its context exactly as the trainer does."""
    policy, tokenizer, model_dir = load_policy(model, run_dir, seed, device, dtype)
    encoder = PromptEncoder(tokenizer, data.max_prompt_tokens, device, data.chat_template_kwargs)
    longest = longest_prompt(data.max_prompt_tokens, env, rollout.max_new_tokens)  # sizes vLLM's context
    generator, loop = make_generator(policy, tokenizer, rollout, longest)
    generator, environment = with_environment(
        generator, encoder, tokenizer, env, sandbox, rollout, context_length(policy)
    )
    fitted, budget = fit_to_model({split: examples}, encoder, policy, data, rollout)
    kept = fitted[split][: max_prompts or None]
    if not kept:
        raise GrpoError(f"split={split} of data={data.kind} selects no prompts")
    if environment is not None:
        loop = f"{loop}; environment {environment}"
    return SamplingModel(Path(model_dir), encoder, generator, kept, budget, loop)


def fit_to_model(
    splits: dict[str, list[dict[str, Any]]],
    encoder: PromptEncoder,
    policy: torch.nn.Module,
    data: DataConfig,
    rollout: RolloutConfig,
) -> tuple[dict[str, list[dict[str, Any]]], PromptBudget]:
    """Each split's prompts that fit the model's context with room for `rollout.max_new_tokens`
    (data.on_long_prompt decides the rest): train, rollout and eval cut prompts the same way."""
    limits = data.max_prompt_tokens, rollout.max_new_tokens, context_length(policy)
    return fit_prompts(splits, encoder, *limits, data.on_long_prompt)


@dataclass
class SamplerSide:
    """What the asynchronous sampler's thread samples with (rollout.max_staleness >= 1): nothing it
    shares with the learner's thread but the frozen weights of a LoRA run's base."""

    generator: Generator  # its own loop (and environment), on weights of its own
    encoder: PromptEncoder  # its own tokenizer: a fast tokenizer is not safe to share between threads
    refresh: Callable[[], None]  # its weights take the policy's: called while the sampler waits
    weights: str  # which weights sample, for the start-up log
    bf16: bool  # they are a bf16 copy (monitor.copy_gap_alert applies)


def async_sampler(
    policy: torch.nn.Module, tokenizer: Any, loop: Generator, cfg: TrainConfig, context: int | None
) -> SamplerSide:
    """The sampler of `rollout.max_staleness` >= 1, from the loop make_generator picked. The hf backend
    decodes a copy of the policy (bf16 where rollout.sampling_weights takes one, else the policy's
    dtype), refreshed at each hand-off; vLLM's engine holds weights of its own and gets them pushed
    at the hand-off. Either reports the log-probs of what it sampled (Rollout.engine_logps): the
    behaviour policy the rollout correction weighs stale tokens against."""
    tokenizer = copy.deepcopy(tokenizer)
    encoder = PromptEncoder(tokenizer, cfg.data.max_prompt_tokens, policy.device, cfg.data.chat_template_kwargs)
    if isinstance(loop, (VLLMGenerator, VLLMServerGenerator)):
        engine = loop

        def push() -> None:
            engine.weights_updated()
            engine.sync.sync()  # now, while the sampler waits: later the learner is moving the weights

        refresh, generator, bf16, words = push, loop, False, "the vLLM engine's (pushed at each hand-off)"
    elif isinstance(loop, FastGenerator):
        bf16, words = sampling_weights_choice(policy, cfg.rollout, "fast")
        weights = SamplingCopy(policy, torch.bfloat16 if bf16 else None)
        generator = FastGenerator(
            policy, tokenizer, cfg.rollout, weights, loop.row_operation, seeded_per_step=True, fixed=loop.fixed
        )
        refresh, words = weights.refresh, (words if bf16 else "a copy of the policy's weights (the sampler's own)")
    else:
        raise GrpoError(
            f"rollout.max_staleness={cfg.rollout.max_staleness} needs the log-probs the sampler drew its tokens "
            "with (the fast loop and vLLM report them), and this run samples with transformers' generate: use "
            "rollout.loop=fast (the start-up line says why it was not chosen) or rollout.max_staleness=0"
        )
    generator, _ = with_environment(generator, encoder, tokenizer, cfg.env, cfg.sandbox, cfg.rollout, context)
    return SamplerSide(generator, encoder, refresh, words, bf16)


@torch.no_grad()
def generate_groups(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    group_size: int,
    greedy: bool = False,
) -> Rollout:
    """G completions per example: one model turn each, or (an `EpisodeGenerator`, env.*) trajectories
    with the environment, which needs the rows themselves."""
    if isinstance(generator, EpisodeGenerator):
        return generator.run(examples, encoder, group_size, greedy=greedy)
    prompt_ids, prompt_mask = encoder([ex["prompt"] for ex in examples])
    return generator.generate(prompt_ids, prompt_mask, group_size, greedy=greedy)


def score_rollout(
    examples: list[dict[str, Any]],
    rollout: Rollout,
    executor: RewardExecutor,
    fusion: RewardFusion,
    weights: dict[str, float] | None = None,
    update_state: bool = True,
    grouped: bool = True,
    combine: Callable[[dict[str, BatchScores]], dict[str, BatchScores]] | None = None,
) -> FusionResult:
    """Token counts (EOS included) are the lengths the `overlong` reward reads. `combine`: see
    `score_and_fuse` (data-parallel training fuses the global batch)."""
    scores = score_rows(examples, rollout, executor, fusion, combine)
    return fusion.fuse(scores, rollout.group_size, weights, update_state=update_state, grouped=grouped)


def score_rows(
    examples: list[dict[str, Any]],
    rollout: Rollout,
    executor: RewardExecutor,
    fusion: RewardFusion,
    combine: Callable[[dict[str, BatchScores]], dict[str, BatchScores]] | None = None,
) -> dict[str, BatchScores]:
    """Every reward function's raw scores for a rollout (`score_batch`), before any fusion. A
    multi-turn rollout adds the environment's columns, and its failed rows score None everywhere."""
    lengths, ids = rollout.lengths.tolist(), rollout.token_lists()
    batch = RewardBatch.from_groups(examples, rollout.texts, lengths, rollout.group_size, completion_ids=ids)
    combine = with_environment_columns(batch, rollout.env_columns or {}, combine)
    batch.columns.update(multi_turn_columns(rollout.messages, rollout.environments))  # TRL's keywords
    return score_batch(executor, fusion, batch, combine)


def generate_and_score(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    executor: RewardExecutor,
    fusion: RewardFusion,
    group_size: int,
    batch_size: int,
    greedy: bool = False,
    weights: dict[str, float] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> ScoredSamples:
    """Evaluation's rollouts, `batch_size` prompts at a time, scored without touching the fusion's state.

    Eval completions are not rivals whose differences are learnt from, so group normalisations are
    off (`grouped=False`): per-function means are raw scores and the fused reward is their
    weighted mean, whatever the group size (a z-score within a greedy group of one is always 0).
    `on_batch(prompts, tokens)` after each batch: `grpo eval`'s progress.
    """
    samples = ScoredSamples(group_size)
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        rollout = generate_groups(batch, encoder, generator, group_size, greedy=greedy)
        result = score_rollout(batch, rollout, executor, fusion, weights, update_state=False, grouped=False)
        lengths, truncated = rollout.lengths.tolist(), rollout.truncated.tolist()
        samples.add(result.fused, result.per_function, lengths, truncated, rollout.texts)
        if on_batch is not None:
            on_batch(len(batch), int(rollout.lengths.sum()))
    return samples


def evaluate_greedy(
    examples: list[dict[str, Any]],
    encoder: PromptEncoder,
    generator: Generator,
    executor: RewardExecutor,
    fusion: RewardFusion,
    rule: SuccessRule,
    batch_size: int,
    weights: dict[str, float] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    answers: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """One greedy answer per held-out prompt: accuracy, reward/mean, reward/<fn>/mean, length/mean,
    truncated/rate. The trainer logs them under `eval/`, `grpo eval` under `greedy/`: one function,
    so a checkpoint's figures agree between the two. `answers`, when given, receives each prompt's
    answer (`greedy_answers`: what eval.json lists beside the figures)."""
    if not examples:  # no held-out split (data.eval_fraction=0): nothing to report
        return {}
    samples = generate_and_score(examples, encoder, generator, executor, fusion, 1, batch_size, True, weights, on_batch)
    if answers is not None:
        answers.extend(greedy_answers([ex["prompt"] for ex in examples], samples, rule))
    return sample_metrics(samples, rule)
