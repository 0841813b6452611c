"""Issue 55's "must show" for env=agent, through GRPOTrainer on the tiny default: the example agent
(examples/openai_agent.py, written with the `openai` package and no grpo import) trains through
the endpoint, the rows the trainer trains on are the ids the endpoint sampled, the harness's
messages are out of the loss (sampled_mask 0), and a harness that raises, hangs or never calls
the endpoint costs one episode each, with the step's alert naming the harness and the cause."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

from grpo_cli.config.schema import RewardFunctionConfig, TrainConfig
from grpo_cli.rollout.base import Rollout
from grpo_cli.training import GRPOTrainer
from tests.conftest import REPO

EXAMPLE = f"{REPO / 'examples' / 'openai_agent.py'}:run"
episodes = itertools.count()


def flaky_agent(base_url: str, api_key: str, row: dict[str, Any]) -> float | None:
    """One request, as the example's first; but the first three episodes raise, hang, and return
    without a request."""
    n = next(episodes)
    if n == 0:
        raise ValueError("the agent's parser broke")
    if n == 1:
        time.sleep(60)  # past env.timeout_s
    if n == 2:
        return 1.0
    chat = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    chat.chat.completions.create(model="policy", messages=[{"role": "user", "content": str(row["prompt"])}])
    return 0.0


def agent_config(agent: str, steps: int) -> TrainConfig:
    cfg = TrainConfig()  # the tiny default: a random 2-layer model, 4 new tokens a turn
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 2, 4
    cfg.env.name, cfg.env.agent, cfg.env.timeout_s = "agent", agent, 20.0
    cfg.reward.functions = [
        RewardFunctionConfig(name="env_reward", target="env_reward"),  # what the harness returned
        RewardFunctionConfig(name="partial_credit", target="answer_partial_credit"),  # scores the last reply
    ]
    return cfg


class Captured:
    """The trainer, with every Rollout its generator returned and the endpoint's records of it."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.trainer = GRPOTrainer(cfg, run_dir)
        self.trainer.setup()
        self.rollouts: list[tuple[Rollout, list[Any]]] = []
        generator = self.generator = self.trainer.generator
        run = generator.run

        def recorded(*args: Any, **kwargs: Any) -> Rollout:
            rollout = run(*args, **kwargs)
            self.rollouts.append((rollout, generator.records))
            return rollout

        generator.run = recorded


def test_the_example_agent_trains_on_the_ids_the_endpoint_sampled(tmp_path: Path) -> None:
    run = Captured(agent_config(EXAMPLE, steps=2), tmp_path)
    try:
        history = run.trainer.train()
    finally:
        run.trainer.cleanup()
    assert [row["step"] for row in history] == [1, 2]
    assert any(row["grad_norm"] > 0 for row in history)  # a real update, on what the agent's episodes sampled
    for rollout, records in run.rollouts:
        assert rollout.env_columns["env_error"] == [None] * 8 and rollout.forks is None
        assert rollout.env_columns["env_turns"] == [2] * 8  # the example asks, then asks to check
        for i, (first, second) in enumerate(records):
            n = int(rollout.completion_mask[i].sum())
            ids, mask = rollout.completion_ids[i, :n].tolist(), rollout.sampled_mask[i, :n].tolist()
            between = second.context[len(first.context) + len(first.sampled) :]
            assert rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist() == first.context
            assert ids == first.sampled + between + second.sampled  # the rows' ids: what the endpoint sampled
            assert mask == [1] * len(first.sampled) + [0] * len(between) + [1] * len(second.sampled)
            assert "user: Check it. The number only:" in run.trainer.tokenizer.decode(between)  # masked out
    assert sum(run.generator.batch_sizes) == 2 * 2 * 8  # every request sampled, in batches


def test_a_harness_that_raises_hangs_or_never_calls_costs_one_episode_each(tmp_path: Path) -> None:
    cfg = agent_config(f"{__name__}:flaky_agent", steps=1)
    cfg.env.timeout_s = 2.0
    run = Captured(cfg, tmp_path)
    try:
        started = time.perf_counter()
        result = run.trainer.step()
        assert time.perf_counter() - started < 20  # the hung harness cost its episode's deadline, not the run
    finally:
        run.trainer.cleanup()
    ((rollout, _),) = run.rollouts
    name = f"agent {__name__}:flaky_agent: "
    errors = sorted(why for why in rollout.env_columns["env_error"] if why is not None)
    assert errors == [
        name + "did not return within env.timeout_s=2s (its thread is left behind)",
        name + "raised ValueError: the agent's parser broke",
        name + "returned without a request to the endpoint (was its client given the base_url and api_key?)",
    ]
    (alert,) = [line for line in result.alerts if line.startswith("the agent failed")]
    assert alert.startswith("the agent failed on 3 of 8 rows (their rewards None); first: " + name)
    assert sum(v == v for v in result.fused) == 5  # the other five episodes trained
