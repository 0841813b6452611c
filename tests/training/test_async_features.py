"""No feature is async-only or sync-only (issue 54): with `rollout.max_staleness=1` the real trainer
runs LoRA, an environment's multi-turn rows, TRL-style rewards under a curriculum, greedy evaluation
while the sampler samples and a bf16 sampling copy; what the pipelined sampler cannot do is refused
at start-up in one line naming both keys. Data-parallel and FSDP at k=1: tests/training/test_data_parallel.py.

The lag is fixed (training/async_pipeline.py): batch j is sampled by the policy of step j-1, so a
3-step run logs `async/staleness` 0, 1, 1 and `async/version` 0, 0, 1; with optim.warmup_steps=0 the
first update moves the weights, so the stale batches' `rollout/engine_gap` is > 0 while the first
batch's (sampled and trained by the same weights, an fp32 copy) is 0 up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import (
    CurriculumConfig,
    CurriculumPhase,
    EvalConfig,
    ModelConfig,
    RewardFunctionConfig,
    RolloutRunConfig,
    TrainConfig,
)
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy, load_tokenizer
from grpo_cli.monitor import MetricsFile
from grpo_cli.rollout.sampling_copy import SamplingCopy, native_bf16
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics
from tests.rewards import trl_functions
from tests.training.test_lora import lora_config
from tests.training.test_trainer import small_config

STEPS = 3
LAG = [0.0, 1.0, 1.0]  # async/staleness of steps 1..3 at k=1: the first batch is sampled by the starting weights
VERSIONS = [0.0, 0.0, 1.0]  # async/version: the policy version (steps trained) that sampled each batch


def at_k1(cfg: TrainConfig) -> TrainConfig:
    cfg.rollout.max_staleness = 1
    cfg.optim.warmup_steps = 0  # the first update moves the weights: a stale batch's sampler differs from the policy
    return cfg


class Trained:
    """A finished run's history, the trainer's figures kept for the asserts, and what `keep` read
    from the trainer before its models were freed."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, keep: Callable[[GRPOTrainer], Any] | None = None) -> None:
        trainer = GRPOTrainer(cfg, run_dir, [MetricsFile(run_dir / "metrics.jsonl")])
        trainer.setup()
        self.before = keep(trainer) if keep else None
        try:
            self.history = trainer.train()
            self.after = keep(trainer) if keep else None
            self.diagnostics = trainer.diagnostics
            self.evaluated_again = trainer.evaluate() if cfg.train.eval_every else None
        finally:
            trainer.observers[0].close()
            trainer.cleanup()
        self.run_dir = run_dir

    def column(self, key: str) -> list[float]:
        return [row[key] for row in self.history]


def assert_pipelined(run: Trained) -> None:
    """Every step trained a batch the sampler's thread produced, one policy version behind."""
    assert [row["step"] for row in run.history] == list(range(1, STEPS + 1))
    assert run.column("async/staleness") == LAG
    assert run.column("async/version") == VERSIONS
    for row in run.history:
        assert 0.0 <= row["async/learner_idle"] <= 1.0 and 0.0 <= row["async/sampler_idle"] <= 1.0
    assert all(row["optimizer_steps"] == 1 for row in run.history)
    assert [row["async/staleness"] for row in read_metrics(run.run_dir)] == LAG  # the file a user reads says it too
    gap = run.column("rollout/engine_gap")
    assert gap[1] > 0 and gap[2] > 0, gap  # stale batches: the sampler's weights are not the trained ones


# ---- LoRA ---------------------------------------------------------------------------------------
def adapters(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return Trained(at_k1(lora_config(steps=STEPS)), tmp_path_factory.mktemp("lora"), adapters)


def test_lora_trains_at_k1_and_its_adapters_move(lora_run: Trained) -> None:
    assert_pipelined(lora_run)
    assert lora_run.column("rollout/engine_gap")[0] < 1e-5  # the sampler's copy took the adapters as they were
    before, after = lora_run.before, lora_run.after
    assert before.keys() == after.keys() and before
    moved = [n for n in before if "lora_B" in n and not torch.equal(before[n], after[n])]
    assert moved, "no adapter moved in 3 steps at rollout.max_staleness=1"


# ---- an environment: multi-turn rows -------------------------------------------------------------
@pytest.fixture(scope="module")
def eos_leaning_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with EOS's output row along its mean final hidden state (logit 4 there): most
    turns end before rollout.max_new_tokens, so EchoEnv's answer opens another turn (a truncated
    turn ends its trajectory)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        tokens = torch.randint(0, tokenizer.eos_token_id, (8, 24), generator=torch.Generator().manual_seed(0))
        mean = model(input_ids=tokens, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        model.lm_head.weight[tokenizer.eos_token_id] = 4.0 * mean / mean.square().sum()
    saved = tmp_path_factory.mktemp("eos_leaning")
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    return saved


@pytest.fixture(scope="module")
def env_run(eos_leaning_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    cfg = at_k1(small_config(steps=STEPS))
    cfg.model = ModelConfig(kind="hf", path=str(eos_leaning_model))
    cfg.env.name, cfg.env.target, cfg.env.max_turns = "custom", "tests.rollout.environments:EchoEnv", 3
    cfg.rollout.max_new_tokens = 8
    cfg.reward.functions = [RewardFunctionConfig(name="env_reward", target="env_reward")]
    return Trained(cfg, tmp_path_factory.mktemp("env"))


def test_an_environments_multi_turn_rows_train_at_k1(env_run: Trained) -> None:
    """The trajectories run turn by turn in the sampler's thread (EchoEnv answers every turn), and
    their reward (the turns each saw) is scored and trained on the learner's, every step."""
    assert_pipelined(env_run)
    for row in env_run.history:
        assert 1.5 < row["env/turns_mean"] <= 3.0 and row["env/error_frac"] == 0.0  # most rows multi-turn
        assert row["env/context_token_frac"] > 0  # the environment's answers are in the trained rows' context
        assert row["reward/env_reward/mean"] == row["env/turns_mean"]


# ---- TRL-style rewards under a curriculum ---------------------------------------------------------
@pytest.fixture(scope="module")
def trl_curriculum_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trained, list[dict]]:
    """Two TRL-style functions; curriculum=phased hands the whole weight to the first for steps 1-2
    (until 0.5 of 4 steps) and to the second for steps 3-4."""
    cfg = at_k1(small_config(steps=4))
    target = "tests.rewards.trl_functions:"
    cfg.reward.functions = [
        RewardFunctionConfig(name="longer", target=target + "longer_is_better"),
        RewardFunctionConfig(name="ids", target=target + "shorter_in_tokens"),
    ]
    cfg.curriculum = CurriculumConfig(
        name="phased",
        phases=[CurriculumPhase(0.5, {"longer": 1.0, "ids": 0.0}), CurriculumPhase(1.0, {"longer": 0.0, "ids": 1.0})],
    )
    trl_functions.SEEN.clear()
    run = Trained(cfg, tmp_path_factory.mktemp("trl"))
    return run, list(trl_functions.SEEN)  # what each call was handed (reward.num_workers=0: in this process)


def test_trl_style_rewards_and_a_curriculum_follow_the_trained_step_at_k1(
    trl_curriculum_run: tuple[Trained, list[dict]],
) -> None:
    """The curriculum's phase and TRL's trainer_state.global_step are the learner's step, not the
    sampler's (a batch ahead); the functions score the very completions that step trains."""
    run, seen = trl_curriculum_run
    assert run.column("async/staleness") == [0.0, 1.0, 1.0, 1.0]
    fused = run.column("reward/mean")
    assert fused[:2] == run.column("reward/longer/mean")[:2]  # phase 1: the weight is all longer's
    assert fused[2:] == run.column("reward/ids/mean")[2:]  # phase 2: all ids'
    for row in run.history:
        assert row["reward/ids/mean"] == pytest.approx(-row["completion_len/mean"])  # the trained completions' ids
    assert [call["step"] for call in seen if call["fn"] == "shorter_in_tokens"] == [0, 1, 2, 3]


# ---- greedy evaluation while the sampler samples ----------------------------------------------------
@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return Trained(at_k1(small_config(steps=STEPS, eval_every=1)), tmp_path_factory.mktemp("eval"))


def test_greedy_evaluation_scores_the_trained_policy_at_k1(eval_run: Trained) -> None:
    """train.eval_every decodes the policy on the learner's thread while the sampler's thread samples
    the next batch on its own copy: the figures are those of the policy alone, evaluated again once
    the sampler has stopped."""
    assert_pipelined(eval_run)
    assert all("eval/reward/mean" in row for row in eval_run.history)
    last = eval_run.history[-1]
    assert {k: last[k] for k in eval_run.evaluated_again} == eval_run.evaluated_again


# ---- a bf16 sampling copy --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    if not native_bf16(torch.device("cpu")):
        pytest.skip("this CPU has no native bf16 matrix multiply: rollout.sampling_weights=bf16 would emulate it")
    cfg = at_k1(small_config(steps=STEPS))
    cfg.rollout.sampling_weights = "bf16"
    return Trained(cfg, tmp_path_factory.mktemp("bf16"), lambda t: [p.detach().clone() for p in t.model.parameters()])


def test_a_bf16_sampling_copy_samples_at_k1(bf16_run: Trained) -> None:
    """The sampler's thread decodes a bf16 copy: even the first batch, sampled and trained by the same
    weights, has an engine gap (bf16's rounding) where the fp32 copy has none, and the run trains."""
    assert_pipelined(bf16_run)
    assert "bf16 copy" in bf16_run.diagnostics["sampling_weights"]
    assert 0.0 < bf16_run.column("rollout/engine_gap")[0] < 0.05
    assert any(not torch.equal(a, b) for a, b in zip(bf16_run.before, bf16_run.after))


# ---- prompts cut to the context ---------------------------------------------------------------------
def test_the_sampler_cuts_prompts_to_the_budget_start_up_clamped_at_k1(tmp_path: Path) -> None:
    """data.max_prompt_tokens=64 + rollout.max_new_tokens=8 exceed the model's 64 positions: start-up
    clamps prompts to 56 tokens (fit_prompts), and the pipelined sampler's own encoder must cut them
    there too, or the policy trains on sequences past its context."""
    cfg = small_config(steps=2)
    cfg.rollout.max_staleness = 1
    cfg.model.tiny.max_position_embeddings, cfg.rollout.max_new_tokens = 64, 8
    cfg.data.template = "Please compute this sum carefully, then answer with one number only: {prompt}"  # > 56
    positions: list[int] = []

    def watch(trainer: GRPOTrainer) -> None:
        def longest(module, args, kwargs) -> None:
            if kwargs.get("position_ids") is not None:
                positions.append(int(kwargs["position_ids"].max()) + 1)

        trainer.model.register_forward_pre_hook(longest, with_kwargs=True)

    Trained(cfg, tmp_path, watch)
    assert positions and max(positions) <= 64


# ---- what is refused ------------------------------------------------------------------------------
def refusal(call, *args) -> str:
    with pytest.raises(GrpoError) as refused:
        call(*args)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_dynamic_sampling_is_refused_at_k1() -> None:
    cfg = at_k1(small_config())
    cfg.algo.dynamic_sampling.enabled = True
    message = refusal(validate, cfg)
    assert "rollout.max_staleness=1" in message and "algo.dynamic_sampling" in message


def test_a_negative_max_staleness_is_refused() -> None:
    cfg = small_config()
    cfg.rollout.max_staleness = -1
    assert "rollout.max_staleness=-1" in refusal(validate, cfg)


def test_the_generate_loop_is_refused_at_k1(tmp_path: Path) -> None:
    """transformers' generate reports no log-probs of what it drew: no behaviour policy to correct against."""
    cfg = at_k1(small_config())
    cfg.rollout.loop = "generate"
    trainer = GRPOTrainer(cfg, tmp_path)
    try:
        message = refusal(trainer.setup)
    finally:
        trainer.cleanup()
    assert "rollout.max_staleness=1" in message and "rollout.loop=fast" in message


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_grpo_eval_and_rollout_refuse_a_max_staleness(command: str) -> None:
    """They share train's rollout section, and nothing trains there."""
    cfg = EvalConfig() if command == "eval" else RolloutRunConfig()
    cfg.rollout.max_staleness = 1
    check = validate_eval if command == "eval" else validate_rollout
    assert "rollout.max_staleness=1" in refusal(check, cfg)


def test_the_samplers_copy_of_a_lora_policy_shares_the_frozen_base(tmp_path: Path) -> None:
    """At k >= 1 the sampler's thread decodes a copy of the policy in its own dtype (async_sampler):
    a LoRA run's base never changes, so the copy holds the adapters only, not a second model."""
    cfg = lora_config()
    policy, _, _ = load_policy(cfg.model, tmp_path, 0, torch.device("cpu"), "fp32")
    copy = SamplingCopy(policy, None)
    pairs = list(zip(policy.named_parameters(), copy.module.named_parameters(), strict=True))
    base = [(p, q) for (name, p), (_, q) in pairs if "lora_" not in name]
    assert base and all(p is q for p, q in base), "the sampler's copy duplicates the frozen base"
    adapters = [(p, q) for (name, p), (_, q) in pairs if "lora_" in name]
    assert adapters and all(p is not q and torch.equal(p, q) for p, q in adapters)
    with torch.no_grad():
        adapters[0][0].add_(1.0)
    copy.refresh()
    assert torch.equal(adapters[0][0], adapters[0][1])  # the hand-off gives the copy the trained adapters
