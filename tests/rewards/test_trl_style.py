"""A reward function written for TRL's GRPOTrainer runs unchanged (issue 38 item 0): TRL calls it by
keyword with prompts, completions (messages for chat data), completion_ids, trainer_state,
log_extra, log_metric and the data's columns; ours keep (prompts, completions, **columns)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import EnvConfig, RewardFunctionConfig, RolloutConfig, SandboxConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_tokenizer
from grpo_cli.rewards import RewardExecutor, RewardFusion, resolve_reward_sources
from grpo_cli.rewards.trl_style import calling_convention, multi_turn_columns
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.rollout.stream import group_records, indexed_examples
from grpo_cli.scoring.score_file import score_rollouts_file
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups, score_rows
from tests.conftest import Recorder, read_metrics, run_grpo
from tests.rewards import trl_functions

TARGET = "tests.rewards.trl_functions:"


def train(tmp_path: Path, functions: list[RewardFunctionConfig], steps: int = 2, chat: bool = False) -> Recorder:
    """The trainer as `grpo train` runs it, with an observer keeping each step's result."""
    cfg = TrainConfig()
    cfg.reward.functions = functions
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 2, 2
    cfg.data.chat = chat
    cfg.monitor.plots = False
    recorder = Recorder()
    trainer = GRPOTrainer(cfg, tmp_path, [recorder])
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    return recorder


def test_trls_signatures_train_unchanged_with_the_sampled_ids_and_the_trainer_state(tmp_path: Path) -> None:
    trl_functions.SEEN.clear()
    functions = [
        RewardFunctionConfig(name="longer", target=TARGET + "longer_is_better"),
        RewardFunctionConfig(name="shorter", target=TARGET + "shorter_in_tokens"),
    ]
    results = train(tmp_path, functions).results
    metrics = [result.metrics for result in results]
    shorter = [seen for seen in trl_functions.SEEN if seen["fn"] == "shorter_in_tokens"]
    assert [seen["step"] for seen in shorter] == [0, 1]  # trainer_state.global_step: optimizer steps taken
    assert all(seen["trainer_state"].max_steps == 2 for seen in shorter)
    for seen, row in zip(shorter, metrics):
        # the sampled token ids: as many as the lengths every reward reads, their mean the step's
        assert [len(ids) for ids in seen["ids"]] == seen["completion_lengths"]
        assert row["reward/shorter/mean"] == pytest.approx(-row["completion_len/mean"])
        assert row["reward/shorter/mean_ids"] == pytest.approx(row["completion_len/mean"])  # log_metric
        assert seen["answer"] and len(seen["answer"]) == len(seen["ids"])  # the data's columns, by name
    longer = [seen for seen in trl_functions.SEEN if seen["fn"] == "longer_is_better"]
    assert all(isinstance(c, str) for seen in longer for c in seen["completions"])  # text data: texts
    first = results[0].samples[0]  # a row of completions/step_000001.jsonl
    assert first["logged"] == {"shorter/ids_seen": len(shorter[0]["ids"][0])}  # log_extra: a column of the log


def test_chat_data_hands_prompts_and_completions_as_messages(tmp_path: Path) -> None:
    trl_functions.SEEN.clear()
    results = train(
        tmp_path, [RewardFunctionConfig(name="longer", target=TARGET + "longer_is_better")], 1, True
    ).results
    seen = trl_functions.SEEN[0]
    assert all(p[-1]["role"] == "user" for p in seen["prompts"])
    assert all(c == [{"role": "assistant", "content": c[0]["content"]}] for c in seen["completions"])
    assert seen["completions"][0][0]["content"] == results[0].samples[0]["completion"]


def test_a_trl_function_scores_in_a_worker_process_and_its_log_metric_comes_back() -> None:
    spec = RewardFunctionConfig(name="has_answer", target=TARGET + "answer_in_completion", parallel=True)
    sources = resolve_reward_sources([spec])
    with RewardExecutor(num_workers=1) as executor:
        scores = executor.run(sources, ["1+1="] * 2, ["it is 2", "3"], {"answer": ["2", "2"]})["has_answer"]
    assert scores.error is None, scores.error
    assert scores.values == [1.0, 0.0] and scores.logged == {"rows": [2.0]}


def test_which_convention_a_signature_asks_for_and_what_calling_forces() -> None:
    def ours(prompts, completions, **columns): ...

    def ids_by_keyword(prompts, completions, completion_ids=None, **kwargs): ...

    assert calling_convention(trl_functions.longer_is_better) == "trl"
    assert calling_convention(trl_functions.shorter_in_tokens) == "trl"
    assert calling_convention(ours) == "grpo" and calling_convention(ours, "trl") == "trl"
    assert calling_convention(ids_by_keyword) == "trl" and calling_convention(ids_by_keyword, "grpo") == "grpo"


def test_a_signature_neither_convention_takes_is_refused_naming_those_that_work() -> None:
    with pytest.raises(
        GrpoError, match=r"reward 'x'.*f\(prompts, completions, \*\*columns\).*f\(completions, \*\*kwargs\)"
    ):
        resolve_reward_sources([RewardFunctionConfig(name="x", target=TARGET + "no_completions")])
    with pytest.raises(GrpoError, match=r"calling 'trll' is not one of auto, grpo, trl"):
        resolve_reward_sources([RewardFunctionConfig(name="x", target=TARGET + "longer_is_better", calling="trll")])


def test_a_reward_file_from_trls_docs_trains_from_the_command_line(tmp_path: Path) -> None:
    """As a TRL user brings one: a file beside them, named by module:function."""
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def reward_len(completions, **kwargs):
                return [-abs(20 - len(completion)) for completion in completions]

            def reward_short_ids(prompts, completions, completion_ids, **kwargs):
                return [-len(ids) / 10 for ids in completion_ids]
            """
        )
    )
    run_dir = tmp_path / "run"
    functions = "[{name: len, target: 'my_rewards:reward_len'}, {name: ids, target: 'my_rewards:reward_short_ids'}]"
    proc = run_grpo(
        "train", f"reward.functions={functions}", "train.steps=2", "train.prompts_per_step=2",
        "rollout.num_generations=2", "monitor.plots=false", f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in read_metrics(run_dir):
        assert row["reward/ids/mean"] == pytest.approx(-row["completion_len/mean"] / 10)
        assert row["reward/len/mean"] <= 0 and row["reward/len/nan_frac"] == 0.0


MULTI_TURN_EXAMPLES = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 5)]


@pytest.fixture(scope="module")
def echo_episodes(tiny_model_dir):
    """A multi-turn generator (env=custom, EchoEnv answers every turn) on an EOS-leaning tiny model,
    so turns end and trajectories take several; and its rollout of MULTI_TURN_EXAMPLES, G=3."""
    tokenizer = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] += 3.0 * model.get_input_embeddings().weight.std()
    rollout_cfg = RolloutConfig(max_new_tokens=6)
    env = EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=3)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout_cfg)
    generator, _ = with_environment(generator, encoder, tokenizer, env, SandboxConfig(), rollout_cfg, 512)
    torch.manual_seed(0)
    rollout = generate_groups(MULTI_TURN_EXAMPLES, encoder, generator, 3)
    assert max(rollout.env_columns["env_turns"]) > 1, "no second turn: a conversation would look like a turn"
    return SimpleNamespace(generator=generator, encoder=encoder, tokenizer=tokenizer, cfg=rollout_cfg, rollout=rollout)


def test_a_multi_turn_rollout_hands_trls_environments_and_whole_conversations(echo_episodes) -> None:
    """What TRL 1.16's GRPOTrainer passes a reward on a multi-turn rollout: `environments`, each
    completion's environment instance, and as `completions` the whole conversation after the prompt
    (every model turn and the environment's answers between them), not the last turn's text."""
    rollout = echo_episodes.rollout
    spec = RewardFunctionConfig(name="turns", target=TARGET + "turns_from_the_environments")
    trl_functions.SEEN.clear()
    with RewardExecutor(num_workers=0) as executor:
        scores = score_rows(MULTI_TURN_EXAMPLES, rollout, executor, RewardFusion(resolve_reward_sources([spec])))
    assert scores["turns"].error is None, scores["turns"].error
    seen = trl_functions.SEEN[-1]
    turns = rollout.env_columns["env_turns"]
    assert [type(e).__name__ for e in seen["environments"]] == ["EchoEnv"] * len(turns)
    assert scores["turns"].values == [float(e.turns) for e in seen["environments"]]  # the row's own instance
    for conversation, text, n, env in zip(seen["completions"], rollout.texts, turns, seen["environments"]):
        assert [m["role"] for m in conversation][::2] == ["assistant"] * n  # every model turn, in order
        assert [m["content"] for m in conversation[1::2]] == [f"try again {k}" for k in range(1, n)]  # the answers
        assert conversation[-1] == {"role": "assistant", "content": text} and env.turns >= n


def test_grpo_score_hands_a_trl_style_reward_the_conversations_the_rollouts_file_keeps(echo_episodes, tmp_path) -> None:
    rollout = echo_episodes.rollout
    path = tmp_path / "rollouts.jsonl"
    records = group_records(indexed_examples(MULTI_TURN_EXAMPLES), rollout)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    spec = RewardFunctionConfig(name="longer", target=TARGET + "longer_is_better")
    trl_functions.SEEN.clear()
    with RewardExecutor(num_workers=0) as executor:
        score_rollouts_file(path, tmp_path / "scored.jsonl", RewardFusion(resolve_reward_sources([spec])), executor)
    assert trl_functions.SEEN[-1]["completions"] == rollout.messages


def test_env_trl_hands_the_instances_of_the_users_class(echo_episodes) -> None:
    """As TRL's environment_factory builds them, not grpo's adapter around them."""
    e = echo_episodes
    env = EnvConfig(name="trl", target="tests.rollout.environments:CounterEnv", max_turns=2)
    generator, _ = with_environment(e.generator.inner, e.encoder, e.tokenizer, env, SandboxConfig(), e.cfg, 512)
    examples = [{"prompt": [{"role": "user", "content": "Count."}], "answer": "3"}]
    rollout = generate_groups(examples, e.encoder, generator, 2)
    columns = multi_turn_columns(rollout.messages, rollout.environments)
    assert [type(env).__name__ for env in columns["environments"]] == ["CounterEnv", "CounterEnv"]
