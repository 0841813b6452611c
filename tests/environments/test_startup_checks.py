"""`env.*` mistakes fail at start-up in one line naming the key or the class, not as a traceback or
a run that trains on nothing and exits 0; and the packaged env options exercise multi-turn as
composed (`grpo train env=calculator` keeps the tools' description in every prompt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from grpo_cli.commands.entry import register_schemas
from grpo_cli.commands.rollout import run_rollout
from grpo_cli.config.schema import EnvConfig, RolloutRunConfig, SandboxConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.environments import load_environment
from grpo_cli.errors import GrpoError
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups

BROKEN = "tests.environments.broken"


def small(**env) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, 2, 2
    for key, value in env.items():
        setattr(cfg.env, key, value)
    return cfg


def composed(*overrides: str) -> TrainConfig:
    """The config `grpo train OVERRIDES` runs with, composed from conf/ as the CLI does."""
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=list(overrides)))
    assert isinstance(cfg, TrainConfig)
    return cfg


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"name": "calculator", "max_turns": 0}, "invalid value env.max_turns=0: a trajectory has at least one"),
        ({"name": "none", "max_turns": 5}, "env.max_turns=5: read by env=code_feedback or"),
        ({"name": "none", "target": "my_env:MyEnv"}, "this run's env=none (one model turn per completion"),
        ({"name": "trl", "target": "x:Y", "kwargs": {"size": 3}}, "env.kwargs={'size': 3}: read by env=custom"),
        ({"name": "custom", "target": "x:Y", "timeout_s": 0.0}, "env.timeout_s=0.0: must be > 0"),
    ],
)
def test_bad_env_values_are_refused_in_one_line_before_any_model(env: dict, words: str) -> None:
    with pytest.raises(GrpoError, match=None) as refused:
        validate(small(**env))
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (EnvConfig(name="trl", target=f"{BROKEN}:NoReset"), "a TRL environment class needs reset(**row)"),
        (
            EnvConfig(name="trl", target=f"{BROKEN}:NeedsArguments"),
            "cannot be built with no arguments (TRL builds it so): missing a required argument: 'size'",
        ),
        (
            EnvConfig(name="custom", target=f"{BROKEN}:NeedsArguments", kwargs={"sise": 3}),
            "cannot be built with env.kwargs={'sise': 3}: missing a required argument: 'size'",
        ),
    ],
)
def test_an_environment_class_that_cannot_work_is_refused_naming_env_target(env: EnvConfig, words: str) -> None:
    with pytest.raises(GrpoError) as refused:
        load_environment(env, SandboxConfig())
    assert words in str(refused.value) and f"env.target={env.target!r}" in str(refused.value)


def test_a_trl_reset_gets_the_rows_columns_it_names_by_keyword() -> None:
    """TRL calls reset(**row): a reset(self, answer) gets the row's answer, and nothing else."""
    env = load_environment(EnvConfig(name="trl", target=f"{BROKEN}:AnswerReset"), SandboxConfig()).new()
    assert env.reset({"prompt": "2+2=", "answer": "4"}) == "the answer is 4"


@pytest.mark.parametrize(
    ("env", "data", "words"),
    [
        ({"name": "code_feedback"}, {}, "env=code_feedback runs each row's tests, and no row of the data has"),
        (
            {"name": "trl", "target": "tests.rollout.environments:CounterEnv"},
            {"max_prompt_tokens": 200},
            "env=trl offers tools (increment) through the chat template, and the prompts are plain text",
        ),
    ],
)
def test_an_environment_the_data_cannot_feed_fails_at_setup(tmp_path: Path, env: dict, data: dict, words: str) -> None:
    cfg = small(**env)
    for key, value in data.items():
        setattr(cfg.data, key, value)
    trainer = GRPOTrainer(cfg, tmp_path)
    try:
        with pytest.raises(GrpoError) as refused:
            trainer.setup()
    finally:
        trainer.cleanup()
    assert words in str(refused.value)
    assert not hasattr(trainer, "model")  # before any model loads


def test_env_calculator_keeps_the_tools_description_in_every_prompt_or_refuses(tmp_path: Path) -> None:
    cfg = composed("env=calculator", "train.prompts_per_step=2", "rollout.num_generations=2")
    with pytest.raises(GrpoError, match="the tools' description makes every prompt at least 6"):
        GRPOTrainer(cfg, tmp_path / "default").setup()  # the tiny model's 256 positions cannot hold it
    cfg.model.tiny.max_position_embeddings = 2048
    with pytest.raises(GrpoError, match=r"rollout.max_new_tokens=4: env=calculator: a model turn must hold"):
        GRPOTrainer(cfg, tmp_path / "short").setup()  # 4 tokens: no turn could ever be a call
    cfg.rollout.max_new_tokens = 128  # the command docs/environments.md and conf/env/calculator.yaml give
    trainer = GRPOTrainer(cfg, tmp_path / "long")
    trainer.setup()
    try:
        batch = trainer.sampler.next_batch(2)
        rollout = generate_groups(batch, trainer.encoder, trainer.generator, 2)
        prompt = trainer.tokenizer.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()])
    finally:
        trainer.cleanup()
    assert '"name": "calculate"' in prompt and "<tool_call>" in prompt  # the model is told about the tool
    assert prompt.rstrip().endswith("assistant:")  # and the question is there too, at the end
    assert batch[0]["prompt"][-1]["content"] in prompt


@pytest.mark.parametrize("max_turns", [2, 1])
def test_a_run_whose_turns_are_all_cut_says_no_trajectory_reached_a_second_turn(tmp_path: Path, max_turns: int) -> None:
    """The tiny model at rollout.max_new_tokens=4 never samples an EOS in time: every turn is cut,
    a cut turn gets no answer, and a multi-turn run is single-turn. It says so (not with one turn allowed)."""
    cfg = small(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=max_turns)
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    try:
        result = trainer.step()
    finally:
        trainer.cleanup()
    assert result.metrics["env/turns_mean"] == 1.0
    said = [line for line in result.alerts if "no trajectory reached a second turn" in line]
    assert len(said) == (max_turns > 1)
    assert all("cut at rollout.max_new_tokens before an EOS" in line for line in said)


def test_grpo_rollout_refuses_an_environment_its_data_cannot_feed_before_any_model(tmp_path: Path) -> None:
    cfg = RolloutRunConfig()
    cfg.env.name, cfg.max_prompts = "code_feedback", 2
    with pytest.raises(GrpoError, match="env=code_feedback runs each row's tests, and no row of the data has"):
        run_rollout(cfg, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written, no model built
