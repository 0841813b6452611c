"""env.token_mode under a chat template that drops earlier reasoning, as Qwen3's does: the rows
append, fork and per_turn build from the same episodes, and the trainer's update on forked rows.

The model is the tiny one made a bigram machine: its layers add nothing, so each next token is a
function of the last one, and from any assistant opening ("\\n") it writes `<think>a</think>b` and
its EOS, every turn. `<think>` and `</think>` are tokens of their own, as in Qwen3's vocabulary."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import EnvConfig, RewardFunctionConfig, RolloutConfig, SandboxConfig, TrainConfig
from grpo_cli.core.advantages import group_advantages
from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.episode_rows import update_batch
from grpo_cli.training.pipeline import generate_groups
from tests.training.row_rewards import by_position

TURNS, G = 3, 2
EXAMPLES = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in (1, 2)]
# A template written for this test that treats history as Qwen3's does: an assistant turn after the
# last user message shows its reasoning (an empty `<think></think>` when it has none); an earlier one
# keeps only what follows its `</think>`. KEEPING writes every message as it is.
OPEN = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set content = m['content'] %}"
)
DROP = (
    "{% if m['role'] == 'assistant' %}{% set reasoning = '' %}{% if '</think>' in content %}"
    "{% set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{% if loop.index0 > ns.last_user %}{% set content = '<think>' + reasoning + '</think>' + content %}{% endif %}"
    "{% endif %}"
)
CLOSE = (
    "{{ '<|im_start|>' + m['role'] + '\\n' + content + eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DROPPING, KEEPING = OPEN + DROP + CLOSE, OPEN + CLOSE


@pytest.fixture(scope="module")
def bigram_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model and tokenizer with `<think>`, `</think>`, saved as a model directory (model=hf)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = DROPPING
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    chain = [ids("\n")[0], *ids("<think>a</think>b"), tokenizer.eos_token_id]
    with torch.no_grad():
        for layer in model.model.layers:  # each layer adds nothing to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=False)
        head.weight.zero_()
        embedding = model.get_input_embeddings().weight
        for k, (token, following) in enumerate(zip(chain, chain[1:])):
            embedding[token] = torch.nn.functional.one_hot(torch.tensor(k), model.config.hidden_size).float()
            head.weight[following, k] = 100.0
    model.lm_head = head
    model.config.tie_word_embeddings = False
    path = tmp_path_factory.mktemp("bigram") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sample(path, mode: str, template: str):
    """G episodes per example with EchoEnv (it answers every turn), greedy, under `mode`."""
    tokenizer = load_tokenizer(path)
    tokenizer.chat_template = template
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rollout_cfg = RolloutConfig(max_new_tokens=8)
    env = EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=TURNS, token_mode=mode)
    encoder = PromptEncoder(tokenizer, 128, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout_cfg)
    context = context_length(model)
    generator, _ = with_environment(generator, encoder, tokenizer, env, SandboxConfig(), rollout_cfg, context)
    return generate_groups(EXAMPLES, encoder, generator, G, greedy=True), tokenizer


def rows(rollout) -> list[list[tuple[list[int], list[int], list[int]]]]:
    """Each episode's training rows: (prompt ids, ids after it, the sampled mask)."""
    out = []
    for i in range(len(rollout.texts)):
        real = rollout.completion_mask[i].bool()
        prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
        out.append([(prompt, rollout.completion_ids[i][real].tolist(), rollout.sampled_mask[i][real].tolist())])
    for fork in rollout.forks or []:
        out[fork.episode].append((fork.prompt, fork.tokens, fork.sampled))
    return out


def rendered(tokenizer, example, turns: int) -> list[int]:
    """The conversation after `turns` model turns and EchoEnv's answers, as the template renders it."""
    messages = list(example["prompt"])
    for k in range(1, turns + 1):
        messages.append({"role": "assistant", "content": "<think>a</think>b"})
        messages.append({"role": "user", "content": f"try again {k}"})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_append_keeps_the_sampled_reasoning_where_the_template_would_drop_it(bigram_dir) -> None:
    """One row per episode: every turn's `<think>` tokens stay in the next turn's context, and only
    the environment's answers (cut from the template's rendering) are context the loss skips."""
    rollout, tokenizer = sample(bigram_dir, "append", DROPPING)
    one = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
    shorter = tokenizer.apply_chat_template(one, tokenize=False)
    longer = tokenizer.apply_chat_template([*one, {"role": "user", "content": "r"}], tokenize=False)
    assert not longer.startswith(shorter)  # what made every multi-turn run on such a template stop at turn 2
    turn = tokenizer("<think>a</think>b", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert rollout.forks is None
    for episode, example in zip(rows(rollout), [e for e in EXAMPLES for _ in range(G)]):
        [(prompt, ids, mask)] = episode
        assert prompt == rendered(tokenizer, example, 0)
        sampled = [t for t, m in zip(ids, mask) if m]
        assert sampled == turn * TURNS
        answers = [t for t, m in zip(ids, mask) if not m]
        assert tokenizer.decode(answers).count("try again") == TURNS - 1
        think = tokenizer.convert_tokens_to_ids("<think>")
        assert ids.count(think) == TURNS  # the template would have dropped two of them


def test_fork_trains_the_context_the_template_renders_in_rows_of_their_own(bigram_dir) -> None:
    """Under fork each later turn samples from the template's rendering, which dropped the earlier
    reasoning: it does not extend the row, so each opens a row whose prompt is that rendering, and
    whose trained tokens are only that turn's."""
    rollout, tokenizer = sample(bigram_dir, "fork", DROPPING)
    turn = tokenizer("<think>a</think>b", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    think = tokenizer.convert_tokens_to_ids("<think>")
    for episode, example in zip(rows(rollout), [e for e in EXAMPLES for _ in range(G)]):
        assert len(episode) == TURNS
        for k, (prompt, ids, mask) in enumerate(episode):
            assert ids == turn and mask == [1] * len(turn)
            if k:  # the later rows: the rendering, with no earlier reasoning in it
                expected = rendered(tokenizer, example, k)
                assert prompt == expected and think not in prompt
                assert tokenizer.decode(prompt).count("<|im_start|>assistant\nb") == k
    assert rollout.lengths.tolist() == [len(turn) * TURNS] * len(rollout.texts)  # every row's tokens count


def test_fork_equals_append_under_a_template_that_keeps_history(bigram_dir) -> None:
    """Where the rendering extends the tokens so far, fork builds append's rows exactly; per_turn
    still gives each turn a row of its own, its prompt the whole context before the turn."""
    append, _ = sample(bigram_dir, "append", KEEPING)
    fork, _ = sample(bigram_dir, "fork", KEEPING)
    per_turn, _ = sample(bigram_dir, "per_turn", KEEPING)
    assert fork.forks is None and rows(fork) == rows(append)
    for [(prompt, ids, mask)], split in zip(rows(append), rows(per_turn)):
        starts = [j for j in range(len(mask)) if mask[j] and (j == 0 or not mask[j - 1])]
        ends = [j for j in range(1, len(mask) + 1) if mask[j - 1] and (j == len(mask) or not mask[j])]
        assert len(starts) == TURNS
        expected = [(prompt + ids[:s], ids[s:e], [1] * (e - s)) for s, e in zip(starts, ends)]
        assert split == expected


def test_the_update_trains_every_row_with_its_episodes_advantage(bigram_dir, tmp_path) -> None:
    """update_batch lays the rows out group by group (fillers carry no loss), and GRPOTrainer.learn's
    first-pass dapo loss is -sum_i A_i n_i / sum_i n_i with n_i the tokens episode i sampled in all its rows."""
    rollout, tokenizer = sample(bigram_dir, "fork", DROPPING)
    prompts = [e["prompt"] for e in EXAMPLES for _ in range(G)]
    rewards = torch.tensor(by_position(prompts, rollout.texts))
    advantages, _ = group_advantages(rewards, G, TrainConfig().algo.scale_rewards)
    batch = update_batch(rollout, advantages, rewards, False, tokenizer.pad_token_id)
    assert batch.rollout.group_size == G * TURNS and batch.advantages.numel() == len(rollout.texts) * TURNS
    n = rollout.lengths.float()
    assert batch.loss_mask.sum() == n.sum()
    assert (batch.advantages * batch.loss_mask.sum(-1)).sum() == pytest.approx((advantages * n).sum().item())

    cfg = TrainConfig()
    cfg.model.kind, cfg.model.path = "hf", str(bigram_dir)
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, len(EXAMPLES), G
    cfg.data.chat = True
    cfg.algo.loss_type, cfg.optim.warmup_steps = "dapo", 0
    cfg.reward.functions = [RewardFunctionConfig(name="position", target="tests.training.row_rewards:by_position")]
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    try:
        metrics = trainer.learn(EXAMPLES, rollout, time.perf_counter()).metrics
    finally:
        trainer.cleanup()
    assert advantages.abs().sum() > 0
    assert metrics["loss"] == pytest.approx(-(advantages * n).sum().item() / n.sum().item(), rel=1e-4, abs=1e-7)
