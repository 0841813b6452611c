"""Multi-turn rollouts (env.*) through the functions train, rollout and eval call (generate_groups,
score_rollout, policy_update), on the real tiny model: the model's tokens in the batch are the ids it
sampled, the environment's are context that no loss, KL or denominator counts, TRL environment
classes and plain tools run unchanged, and an environment that raises or hangs costs one row."""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import (
    AlgoConfig,
    EnvConfig,
    RewardConfig,
    RewardFunctionConfig,
    RolloutConfig,
    SandboxConfig,
    TrainConfig,
)
from grpo_cli.core.advantages import group_advantages
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, policy_update
from grpo_cli.environments import load_environment
from grpo_cli.environments.base import TRLEnvironment
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_tokenizer
from grpo_cli.rewards import RewardExecutor, RewardFusion, resolve_reward_sources
from grpo_cli.rollout import VLLMGenerator, make_generator
from grpo_cli.rollout.chat_turns import observation_text, parse_tool_calls, render_prompt, renders_tools, tool_schemas
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length, fit_prompts
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups, score_rollout
from tests.rollout.environments import CounterEnv, multiply
from tests.rollout.test_vllm_engine_logps import LogprobEngine
from tests.training.row_rewards import unscorable_first_prompt

G, NEW = 3, 6
ROW_REWARD = "tests.training.row_rewards:unscorable_first_prompt"  # a score that differs within a group
EXAMPLES = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 5)]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir, tokenizer):
    """The tiny model, more likely to end a turn: an output bias on EOS, so turns end within
    rollout.max_new_tokens and trajectories have several turns (a random model rarely samples EOS)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    head.weight = model.get_input_embeddings().weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 4.0
    model.lm_head = head
    return model


def episodes(model, tokenizer, env: EnvConfig, **rollout_keys):
    rollout = RolloutConfig(max_new_tokens=NEW, **rollout_keys)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout)
    generator, line = with_environment(
        generator, encoder, tokenizer, env, SandboxConfig(), rollout, context_length(model)
    )
    assert line is not None
    return generator, encoder


def echo(**keys) -> EnvConfig:
    return EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=3, **keys)


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """(mask value, ids) runs of a trajectory: the model's turns and the environment's answers."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


def test_the_models_tokens_are_its_sampled_ids_and_the_environments_are_context(model, tokenizer) -> None:
    """Greedy, so each model turn can be replayed: the argmax continuation of exactly the ids before
    it (prompt, earlier turns, the environment's answers as the template writes them). With
    rollout.min_new_tokens=3 (EOS banned for a turn's first 3 tokens, in the replay too) every turn is
    several tokens long, so a context one token short or long would change them. EchoEnv never ends:
    every trajectory runs env.max_turns=3 turns, and its answers are cut to env.max_observation_tokens."""
    generator, encoder = episodes(model, tokenizer, echo(max_observation_tokens=5), min_new_tokens=3)
    torch.manual_seed(0)
    rollout = generate_groups(EXAMPLES, encoder, generator, 1, greedy=True)
    eos = tokenizer.eos_token_id
    several = 0
    for row in range(len(EXAMPLES)):
        n = int(rollout.completion_mask[row].sum())
        ids = rollout.completion_ids[row, :n].tolist()
        runs = segments(ids, rollout.sampled_mask[row, :n].tolist())
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        context = list(prompt)
        replies = [m["content"] for m in rollout.messages[row] if m["role"] == "user"]
        turns = [m["content"] for m in rollout.messages[row] if m["role"] == "assistant"]
        assert [m for m, _ in runs] == [1, 0] * (len(runs) // 2) + [1] * (len(runs) % 2)  # model first, then alternate
        for k, (sampled, tokens) in enumerate(runs):
            if sampled:
                with torch.no_grad():  # the replay: argmax, token by token, over the whole context
                    replay = []
                    for j in range(len(tokens)):
                        logits = model(input_ids=torch.tensor([context + replay])).logits[0, -1]
                        if j < 3:  # rollout.min_new_tokens
                            logits[eos] = -math.inf
                        replay.append(int(logits.argmax()))
                assert replay == tokens, f"row {row}, turn {k // 2 + 1}"
                assert len(tokens) >= 4  # several tokens: the replay can tell a context that is off by one
                assert tokenizer.decode(tokens, skip_special_tokens=True) == turns[k // 2]
            else:
                assert runs[k - 1][1][-1] == eos  # an answer follows a turn that ended with EOS
                expected = observation_text(tokenizer, [{"role": "user", "content": replies[k // 2]}], False, "")
                assert tokens == tokenizer(expected, add_special_tokens=False)["input_ids"]
            context += tokens
        several += len(runs) > 1
        assert replies == ["try a [cut]"] * 2  # "try again N" kept to its first 5 tokens
        assert rollout.env_columns["env_turns"][row] == len(turns) == 3  # env.max_turns, not one more
        assert rollout.env_columns["env_reward"][row] == float(len(turns))  # EchoEnv.reward(): turns it saw
        assert rollout.texts[row] == turns[-1]  # the rewards score the last turn
    assert several >= 2  # the test saw real multi-turn trajectories


def test_the_loss_the_kl_and_every_denominator_count_the_models_tokens_only(model, tokenizer) -> None:
    """policy_update with SGD at lr 1 on a multi-turn batch moves the weights exactly as the loss
    written out by hand over the model's tokens (the environment's only as context) does."""
    generator, encoder = episodes(model, tokenizer, echo())
    torch.manual_seed(1)
    rollout = generate_groups(EXAMPLES, encoder, generator, G)
    assert (rollout.completion_mask.sum() - rollout.sampled_mask.sum()) > 0  # environment tokens are there
    advantages = torch.randn(rollout.completion_ids.size(0), generator=torch.Generator().manual_seed(0))
    policy = copy.deepcopy(model).train()
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    algo = AlgoConfig(beta=0.04)

    def update(mask: torch.Tensor) -> torch.Tensor:
        trained = copy.deepcopy(policy)
        opt = torch.optim.SGD(trained.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        torch.manual_seed(2)
        learner = Learner(trained, opt, sched, reference)
        policy_update(learner, UpdateBatch(rollout, advantages, mask), algo, UpdateSettings(1.0, NEW, 1, 0.0, "padded"))
        return torch.cat([p.detach().reshape(-1) for p in trained.parameters()])

    by_hand = copy.deepcopy(policy)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    width = rollout.completion_ids.size(1)

    def logps(m: torch.nn.Module) -> torch.Tensor:
        logits = m(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, -width - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        ref = logps(reference)
    lp = logps(by_hand)
    m = rollout.sampled_mask.float()
    kl = torch.exp(ref - lp) - (ref - lp) - 1  # k3
    per_token = -advantages.unsqueeze(1) * torch.exp(lp - lp.detach()) + algo.beta * kl
    loss = ((per_token * m).sum(-1) / m.sum(-1)).mean()
    loss.backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            if p.grad is not None:
                p.sub_(p.grad)
    expected = torch.cat([p.detach().reshape(-1) for p in by_hand.parameters()])
    assert torch.allclose(update(rollout.model_mask.float()), expected, atol=1e-6)
    # the environment's tokens in the mask would have moved the weights otherwise: the test can fail
    assert not torch.allclose(update(rollout.completion_mask.float()), expected, atol=1e-6)


def test_packed_passes_equal_padded_ones_when_resets_give_each_row_its_own_prompt(model, tokenizer) -> None:
    """A reset that adds per-episode text leaves the rows of a group with different prompts: the
    packed layout (train.layout=auto picks it here) gives the padded pass's log-probs and update."""
    env = EnvConfig(name="custom", target="tests.rollout.environments:BoardEnv", max_turns=3)
    generator, encoder = episodes(model, tokenizer, env)
    torch.manual_seed(4)
    rollout = generate_groups(EXAMPLES, encoder, generator, G)
    prompts = [tuple(ids[m.bool()].tolist()) for ids, m in zip(rollout.prompt_ids, rollout.prompt_mask)]
    assert len(set(prompts[:G])) == G  # a group's rows: one prompt each
    assert (rollout.completion_mask.sum() - rollout.sampled_mask.sum()) > 0  # multi-turn: environment tokens
    rows = torch.arange(len(prompts))
    mask = rollout.completion_mask
    padded, _ = rows_logprobs(model, rollout, rows, 1.0, "padded", with_entropy=False)
    packed, _ = rows_logprobs(model, rollout, rows, 1.0, "packed", with_entropy=False)
    torch.testing.assert_close(packed * mask, padded * mask, atol=1e-5, rtol=0)
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(0))
    moved = []
    for layout in ("padded", "packed"):
        trained = copy.deepcopy(model).train()
        opt = torch.optim.SGD(trained.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        batch = UpdateBatch(rollout, advantages, rollout.model_mask.float())
        policy_update(Learner(trained, opt, sched, None), batch, AlgoConfig(), UpdateSettings(1.0, NEW, 1, 0.0, layout))
        moved.append(
            torch.cat([(p - q).detach().reshape(-1) for p, q in zip(trained.parameters(), model.parameters())])
        )
    # float rounding only: measured 1.6e-6 of the update's norm, as on rows that share a prompt (0.35 unfixed)
    assert (moved[1] - moved[0]).norm() <= 1e-5 * moved[0].norm() and moved[0].norm() > 0


def test_a_turn_cut_at_the_budget_is_flagged_and_scored_on_the_text_it_trains(model, tokenizer) -> None:
    """env.max_tokens=3 with turns of at least 4 tokens: each row's one turn (env.max_turns=1: no
    answer comes to flag it) is cut to 3 ids, flagged truncated though it ended with EOS, and the rewards
    and the conversation get the text of those 3 ids, not of the turn."""
    env = EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=1, max_tokens=3)
    generator, encoder = episodes(model, tokenizer, env, min_new_tokens=4)
    torch.manual_seed(5)
    rollout = generate_groups(EXAMPLES, encoder, generator, G)
    assert rollout.sampled_mask.sum(-1).tolist() == [3] * len(rollout.texts)  # the budget: nothing else
    assert rollout.truncated.all()
    for row, text in enumerate(rollout.texts):
        kept = tokenizer.decode(rollout.completion_ids[row, :3].tolist(), skip_special_tokens=True)
        assert text == kept and rollout.messages[row] == [{"role": "assistant", "content": kept}]
    assert rollout.env_columns["env_turns"] == [1] * len(rollout.texts)


@pytest.mark.parametrize("policy", ["error", "skip", "truncate_left"])
def test_text_a_reset_adds_past_the_prompt_budget_follows_data_on_long_prompt(model, tokenizer, policy, caplog) -> None:
    """The data's prompts fit at start-up (fit_prompts); a reset's 80 characters of board take them past
    the 64-token budget at run time, where data.on_long_prompt decides as it does for the data."""
    env = EnvConfig(name="custom", target="tests.rollout.environments:BoardEnv", kwargs={"board": 80}, max_turns=2)
    generator, encoder = episodes(model, tokenizer, env)
    fitted, budget = fit_prompts({"train": EXAMPLES}, encoder, 64, NEW, context_length(model), policy)
    assert fitted["train"] == EXAMPLES and budget.long_prompts == 0  # nothing is long before the reset
    if policy == "error":
        with pytest.raises(GrpoError, match=r"longer than 64 tokens .*data\.on_long_prompt=truncate_left or skip"):
            generate_groups(EXAMPLES, encoder, generator, 2)
        return
    with caplog.at_level("WARNING", logger="grpo"):
        rollout = generate_groups(EXAMPLES, encoder, generator, 2)
    errors = rollout.env_columns["env_error"]
    if policy == "skip":  # each row out of the batch: unscorable, as a failed reset is
        assert all("data.on_long_prompt=skip" in e for e in errors)
        return
    assert errors == [None] * len(errors) and rollout.prompt_mask.sum(-1).tolist() == [64] * len(errors)
    assert "truncated from the left (data.on_long_prompt)" in caplog.text  # said, not silent


def test_the_engines_log_probs_stay_on_the_tokens_they_scored_turn_after_turn(model, tokenizer) -> None:
    """vLLM's per-token log-probs (a stand-in engine of vLLM's API: -0.1·(position + 1) in each turn)
    land on each turn's own sampled ids in the trajectory, 0 on the environment's tokens."""
    eos = tokenizer.eos_token_id
    a, b = tokenizer.encode("19"), tokenizer.encode("7")
    engine = LogprobEngine([[(a + [eos], "stop", eos), (b + [eos], "stop", eos)]] * 8)
    rollout_cfg = RolloutConfig(max_new_tokens=NEW)
    inner = VLLMGenerator(model, tokenizer, rollout_cfg, engine=engine, sampling_params=dict, push=lambda w: None)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    env = EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=2)
    generator, _ = with_environment(inner, encoder, tokenizer, env, SandboxConfig(), rollout_cfg, context_length(model))
    rollout = generate_groups(EXAMPLES, encoder, generator, 2)
    assert rollout.engine_logps is not None
    for row in range(len(EXAMPLES) * 2):
        n = int(rollout.completion_mask[row].sum())
        runs = segments(rollout.engine_logps[row, :n].tolist(), rollout.sampled_mask[row, :n].tolist())
        first = a if row % 2 == 0 else b  # the first turn: the group's two scripted completions; then a
        assert [m for m, _ in runs] == [1, 0, 1]
        assert runs[0][1] == pytest.approx([-0.1 * (i + 1) for i in range(len(first) + 1)])
        assert runs[1][1] == [0.0] * len(runs[1][1])
        assert runs[2][1] == pytest.approx([-0.1 * (i + 1) for i in range(len(a) + 1)])
        assert rollout.completion_ids[row, : len(first) + 1].tolist() == first + [eos]


def test_the_trainer_trains_on_the_models_tokens_of_a_multi_turn_batch(model, tokenizer, tmp_path) -> None:
    """GRPOTrainer.learn on a multi-turn rollout: at the first pass (ratio 1) the dapo loss is
    -sum_i A_i·n_i / sum_i n_i with n_i the tokens the model sampled, the environment's left out."""
    generator, encoder = episodes(model, tokenizer, echo())
    torch.manual_seed(6)
    rollout = generate_groups(EXAMPLES, encoder, generator, G)
    assert (rollout.completion_mask.sum() - rollout.sampled_mask.sum()) > 0  # environment tokens are there
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = 1, len(EXAMPLES), G
    cfg.algo.loss_type, cfg.optim.warmup_steps = "dapo", 0
    cfg.reward.functions = [RewardFunctionConfig(name="chars", target=ROW_REWARD, kwargs={"unscorable": False})]
    trainer = GRPOTrainer(cfg, tmp_path)
    trainer.setup()
    try:
        metrics = trainer.learn(EXAMPLES, rollout, time.perf_counter()).metrics
    finally:
        trainer.cleanup()
    prompts = [e["prompt"] for e in EXAMPLES for _ in range(G)]
    rewards = torch.tensor(unscorable_first_prompt(prompts, rollout.texts, unscorable=False))
    advantages, _ = group_advantages(rewards, G, cfg.algo.scale_rewards)
    n = rollout.sampled_mask.sum(-1).float()
    assert advantages.abs().sum() > 0
    assert metrics["loss"] == pytest.approx(-(advantages * n).sum().item() / n.sum().item(), rel=1e-4, abs=1e-7)


def test_a_raising_and_a_hanging_environment_cost_one_row_each(model, tokenizer) -> None:
    env = EnvConfig(name="custom", target="tests.rollout.environments:FlakyEnv", max_turns=2, timeout_s=1.0)
    generator, encoder = episodes(model, tokenizer, env, min_new_tokens=1)
    examples = [{"prompt": p, "answer": a} for p, a in (("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6"))]
    reward = RewardConfig(functions=[RewardFunctionConfig(name="env_reward", target="env_reward")])
    fusion = RewardFusion.from_config(resolve_reward_sources(reward.functions, "cpu", SandboxConfig()), reward)
    started = time.perf_counter()
    rollout = generate_groups(examples, encoder, generator, 2)
    assert time.perf_counter() - started < 20  # the hanging call was given up on at env.timeout_s
    errors = rollout.env_columns["env_error"]
    assert "RuntimeError: the environment broke" in errors[0] and "RuntimeError" in errors[1]
    assert "did not return within env.timeout_s=1s" in errors[2] and "timeout" in errors[3]
    assert errors[4:] == [None, None]
    with RewardExecutor(0, 30.0) as executor:
        result = score_rollout(examples, rollout, executor, fusion)
    assert all(math.isnan(v) for v in result.fused[:4])
    assert all(not math.isnan(v) for v in result.fused[4:])


def test_a_trl_environment_class_runs_unchanged(model, tokenizer) -> None:
    """TRL's protocol: built with no arguments, reset(**row) text goes into the prompt, public methods
    are tools (described to the model: this template does not render tools=), get_reward is the reward."""
    env = EnvConfig(name="trl", target="tests.rollout.environments:CounterEnv", max_turns=2)
    generator, encoder = episodes(model, tokenizer, env)
    examples = [{"prompt": [{"role": "user", "content": "Count to 3."}], "answer": "3"}]
    rollout = generate_groups(examples, encoder, generator, 2)
    prompt = tokenizer.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()])
    assert "to 3.\n\nThe counter starts at 0; the answer is 3." in prompt  # reset(**row), after the prompt
    assert not encoder.template_renders_tools  # the tiny template ignores tools=
    described = render_prompt(tokenizer, examples[0]["prompt"], encoder.tool_schemas, native=False)
    assert '"name": "increment"' in described and "<tool_call>" in described  # the tool, in a system message
    assert rollout.env_columns["env_reward"] == [0.0, 0.0]  # get_reward(): no call was made

    adapter = TRLEnvironment(CounterEnv())
    adapter.reset({"prompt": "p", "answer": "3"})
    call = '<tool_call>\n{"name": "increment", "arguments": {"step": 2}}\n</tool_call>'
    assert adapter.step(f"I will add.{call}{call}") == [
        {"role": "tool", "name": "increment", "content": "2"},
        {"role": "tool", "name": "increment", "content": "4"},
    ]
    assert adapter.reward() == 4.0
    wrong = adapter.step('<tool_call>{"name": "decrement", "arguments": {}}</tool_call>')
    assert wrong[0]["content"].startswith("error: no tool named 'decrement'")  # the model is told, the row goes on
    assert adapter.step("no call: I am done") is None  # a turn without a call ends the trajectory


def test_plain_tool_functions_run_and_are_offered_through_the_template(tokenizer) -> None:
    spec = load_environment(EnvConfig(name="tools", tools=["tests.rollout.environments:multiply"]), SandboxConfig())
    env = spec.new()
    env.reset({})
    assert env.step('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>') == [
        {"role": "tool", "name": "multiply", "content": "42"}
    ]
    assert env.columns() == {"env_tool_calls": 1, "env_tool_errors": 0}
    schemas = tool_schemas([multiply])
    chatml = copy.copy(tokenizer)
    chatml.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}" + CHATML
    )
    assert renders_tools(chatml) and not renders_tools(tokenizer)
    rendered = render_prompt(chatml, [{"role": "user", "content": "6*7?"}], schemas, native=True)
    assert rendered.startswith("TOOLS:multiply;")  # a template that renders tools= gets them its way


def test_the_text_between_turns_is_the_templates_and_never_repeats_the_eos(tokenizer) -> None:
    chatml = copy.copy(tokenizer)
    chatml.chat_template = CHATML
    text = observation_text(chatml, [{"role": "tool", "content": "42"}], True, "<|im_end|>")
    assert text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    tiny = observation_text(tokenizer, [{"role": "user", "content": "again"}], True, "</s>")
    assert tiny == "\nuser: again\nassistant: "  # the tiny template's lines; its EOS is not part of them


def test_tool_calls_are_parsed_and_malformed_ones_explained() -> None:
    text = (
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call> <tool_call>{oops</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert calls[:2] == [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {"y": 2}}]
    assert calls[2]["error"].startswith("the tool call is not JSON")


def test_bad_environment_settings_are_refused_naming_the_key() -> None:
    for env, words in (
        (EnvConfig(name="trl"), "env.target=module:Class"),
        (EnvConfig(name="custom", target="tests.rollout.environments:nope"), "has no attribute nope"),
        (EnvConfig(name="tools", tools=["tests.rollout.environments:EchoEnv.step"]), "env.tools"),
        (EnvConfig(name="nope"), "env.name='nope'"),
        (EnvConfig(name="custom", target="tests.rollout.environments:CounterEnv"), "no step"),
    ):
        with pytest.raises(GrpoError, match=words.replace("(", r"\(").replace(".", r"\.")):
            load_environment(env, SandboxConfig())
