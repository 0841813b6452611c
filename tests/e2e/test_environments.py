"""Multi-turn rollouts from the command line, as a user runs them: `grpo train` with each kind of
environment, and `grpo rollout` -> `grpo score` keeping the conversation and the environment's
columns. The tiny model rarely ends a turn (a random model seldom samples EOS), so these check the
plumbing end to end; tests/rollout/test_episodes.py checks the trajectories themselves."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import read_metrics, run_grpo

QUICK = ("monitor.console=plain", "monitor.plots=false", "train.steps=2", "train.prompts_per_step=2")


def train(run_dir: Path, *overrides: str) -> list[dict]:
    proc = run_grpo("train", *QUICK, f"hydra.run.dir={run_dir}", *overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


def first_completions(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "completions" / "step_000001.jsonl").read_text().splitlines()]


def test_code_feedback_trains_and_logs_each_turn(tmp_path: Path) -> None:
    run_dir = tmp_path / "code"
    metrics = train(
        run_dir, "reward=code", "env=code_feedback", "rollout.num_generations=2", "rollout.max_new_tokens=12",
        "data.max_prompt_tokens=96", "rollout.temperature=2.0",
    )  # fmt: skip
    assert all(1.0 <= row["env/turns_mean"] <= 2.0 and row["env/error_frac"] == 0.0 for row in metrics)
    assert "code_feedback (up to 2 model turns" in metrics[0]["environment"]
    rows = first_completions(run_dir)
    assert all(row["messages"][0]["role"] == "assistant" for row in rows)
    assert all(row["messages"][-1]["role"] == "assistant" for row in rows)  # a reply only ever precedes a turn
    assert {row["completion"] for row in rows} == {row["messages"][-1]["content"] for row in rows}


def test_a_trl_environment_class_trains_with_its_own_reward(tmp_path: Path) -> None:
    run_dir = tmp_path / "trl"
    metrics = train(
        run_dir, "env=trl", "env.target=tests.rollout.environments:CounterEnv", "data.chat=true",
        "data.max_prompt_tokens=1024", "model.tiny.max_position_embeddings=2048", "rollout.max_new_tokens=96",
        "rollout.num_generations=2",
        "reward.functions=[{name: env_reward, target: env_reward, weight: 1.0}]",
    )  # fmt: skip
    assert [row["reward/env_reward/mean"] for row in metrics] == [0.0, 0.0]  # get_reward(): no call was made
    assert "tools: increment" in metrics[0]["environment"]
    assert metrics[0]["env/tool_calls_mean"] == 0.0


def test_calculator_runs_on_the_arithmetic_data(tmp_path: Path) -> None:
    metrics = train(  # the command conf/env/calculator.yaml and docs/environments.md give for the tiny model
        tmp_path / "calc", "env=calculator", "model.tiny.max_position_embeddings=2048", "rollout.max_new_tokens=128",
        "rollout.num_generations=2",
    )
    assert "calculator" in metrics[0]["environment"] and "tools: calculate" in metrics[0]["environment"]
    assert "env/tool_calls_mean" in metrics[0]


def test_rollout_keeps_the_conversation_and_score_reads_the_environments_columns(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    env = ("env=custom", "env.target=tests.rollout.environments:EchoEnv", "env.max_turns=2")
    made = run_grpo("rollout", *env, f"output={out}", "max_prompts=3", "rollout.num_generations=2",
                    "console=plain", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    completions = [c for record in records for c in record["completions"]]
    for c in completions:
        assert c["messages"][-1] == {"role": "assistant", "content": c["text"]}
        assert c["env"]["env_turns"] == sum(m["role"] == "assistant" for m in c["messages"])
        assert c["env"]["env_reward"] == float(c["env"]["env_turns"])  # EchoEnv.reward(): the turns it saw
    scored = tmp_path / "scored.jsonl"
    proc = run_grpo(
        "score", f"input={out}", f"output={scored}", "reward.functions=[{name: env_reward, target: env_reward}]"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rescored = [c for line in scored.read_text().splitlines() for c in json.loads(line)["completions"]]
    assert [c["rewards"]["env_reward"] for c in rescored] == [c["env"]["env_reward"] for c in completions]


def test_eval_scores_trajectories_and_names_the_environment(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    proc = run_grpo(
        "eval", "env=custom", "env.target=tests.rollout.environments:EchoEnv", "env.max_turns=2", "max_prompts=4",
        "reward.functions=[{name: env_reward, target: env_reward}]", "rollout.num_generations=2", "eval.k=[1,2]",
        "rollout.max_new_tokens=16", f"output={out}", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert "environment custom:tests.rollout.environments:EchoEnv (up to 2 model turns" in figures["rollout_loop"]
    assert 1.0 <= figures["reward/env_reward/mean"] <= 2.0  # EchoEnv's reward: the turns each trajectory took
    assert figures["greedy/reward/env_reward/mean"] >= 1.0  # greedy answers ran as trajectories too
