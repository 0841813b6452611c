"""env=agent's endpoint through the function train, rollout and eval call (generate_groups), on the
real tiny model, with harnesses written as users write them (the `openai` package, or plain HTTP):
the rows are built from the ids the endpoint sampled (the harness's text is context, mask 0), a
history the harness rewrote opens a new row, requests are batched across episodes, and the OpenAI
format holds (tool calls, n, max_tokens, streaming, completions, sessions by header or `user`)."""

from __future__ import annotations

import copy
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import torch
from openai import BadRequestError, OpenAI
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import EnvConfig, RolloutConfig, SandboxConfig
from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.agent_endpoint import AgentEndpoint, EndpointRequest, completion_body
from grpo_cli.rollout.agent_episodes import AgentEpisodeGenerator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length
from grpo_cli.training.pipeline import generate_groups

HERE = "tests.rollout.test_agent_endpoint"
NEW = 6
EXAMPLES = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(1, 4)]
SYSTEM = {"role": "system", "content": "Add."}


def client(base_url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def ask_and_check(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    """Two requests, the second extending the first (the reply sent back as the SDK returned it)."""
    chat = client(base_url, api_key)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": row["prompt"]}]
    first = chat.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "Sure?"}]
    chat.chat.completions.create(model="policy", messages=messages)
    return float(len(row["prompt"]))


def rewrite_history(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    """The second request drops the first exchange (as a harness that summarizes its history)."""
    chat = client(base_url, api_key)
    chat.chat.completions.create(model="policy", messages=[SYSTEM, {"role": "user", "content": row["prompt"]}])
    chat.chat.completions.create(model="policy", messages=[SYSTEM, {"role": "user", "content": "Summary: sure?"}])


def three_asks(base_url: str, api_key: str, row: dict[str, Any]) -> list[str]:
    """Three requests, each extending the last; what finish_reason each got is returned through a global."""
    chat = client(base_url, api_key)
    messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
    reasons = []
    for _ in range(3):
        reply = chat.chat.completions.create(model="policy", messages=messages)
        reasons.append(reply.choices[0].finish_reason)
        messages += [reply.choices[0].message, {"role": "user", "content": "again"}]
    FINISHES.append((reasons, reply.choices[0].message.content))
    return None


FINISHES: list[Any] = []


def bad_requests_then_a_good_one(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    """A request without messages, then one the chat template refuses: each a 400 the agent reads."""
    chat = client(base_url, api_key)
    for messages in ([], [{"role": "tool", "content": "42"}]):
        try:
            chat.chat.completions.create(model="policy", messages=messages)
        except BadRequestError as err:
            FINISHES.append(err.message)
    chat.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])


ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}},
}


def with_tools(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    """Tools offered, and a conversation holding a call and its result, as an agent framework sends them."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    messages = [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    client(base_url, api_key).chat.completions.create(model="policy", messages=messages, tools=[ADD])


def too_long(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    reply = client(base_url, api_key).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x" * 300}]
    )
    FINISHES.append((reply.choices[0].finish_reason, reply.choices[0].message.content))


def two_choices_of_one_token(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    reply = client(base_url, api_key).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], n=2, max_tokens=1, temperature=0.2
    )
    FINISHES.append([choice.finish_reason for choice in reply.choices])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir, tokenizer):
    """The tiny model with an output bias on EOS, so replies end within NEW tokens (as a chat model's do)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    head.weight = model.get_input_embeddings().weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 3.0
    model.lm_head = head
    return model


def agent(model, tokenizer, harness: str, **env_keys) -> tuple[AgentEpisodeGenerator, PromptEncoder]:
    rollout = RolloutConfig(max_new_tokens=NEW)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout)
    env = EnvConfig(name="agent", agent=f"{HERE}:{harness}", timeout_s=60.0, **env_keys)
    generator, line = with_environment(
        generator, encoder, tokenizer, env, SandboxConfig(), rollout, context_length(model)
    )
    assert isinstance(generator, AgentEpisodeGenerator) and "endpoint" in line
    return generator, encoder


def main_row(rollout, i: int) -> tuple[list[int], list[int], list[int]]:
    """Row i's prompt ids, completion ids and sampled mask, without padding."""
    prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
    n = int(rollout.completion_mask[i].sum())
    return prompt, rollout.completion_ids[i, :n].tolist(), rollout.sampled_mask[i, :n].tolist()


def test_the_rows_are_the_ids_the_endpoint_sampled_and_the_harness_text_is_context(model, tokenizer) -> None:
    generator, encoder = agent(model, tokenizer, "ask_and_check")
    torch.manual_seed(0)
    rollout = generate_groups(EXAMPLES, encoder, generator, 2)
    assert rollout.forks is None  # append: the second request extends the first, one row per episode
    assert rollout.env_columns["env_error"] == [None] * 6
    assert rollout.env_columns["env_reward"] == [4.0] * 6  # the harness's return value
    assert rollout.env_columns["env_turns"] == [2] * 6
    for i, (first, second) in enumerate(generator.records):
        prompt, ids, mask = main_row(rollout, i)
        assert prompt == first.context  # the first request's rendering is the row's prompt
        between = second.context[len(first.context) + len(first.sampled) :]
        assert second.context[: len(first.context) + len(first.sampled)] == first.context + first.sampled
        assert ids == first.sampled + between + second.sampled  # the sampled ids, never re-tokenized text
        assert mask == [1] * len(first.sampled) + [0] * len(between) + [1] * len(second.sampled)
        assert "user: Sure?" in tokenizer.decode(between)  # the harness's message, as the template writes it
        assert rollout.texts[i] == tokenizer.decode(second.sampled, skip_special_tokens=True)
        roles = [m["role"] for m in rollout.messages[i]]
        assert roles == ["system", "user", "assistant", "user", "assistant"]  # the whole transcript
    # every request sampled once, in batches (how many requests a batch holds depends on the threads' timing:
    # a batch goes when every episode waits, or BATCH_WINDOW_S after the first request)
    assert sum(generator.batch_sizes) == 12 and len(generator.batch_sizes) < 12


@pytest.mark.parametrize("mode", ["append", "fork", "per_turn"])
def test_a_rewritten_history_opens_a_row_of_its_own(model, tokenizer, mode) -> None:
    generator, encoder = agent(model, tokenizer, "rewrite_history", token_mode=mode)
    rollout = generate_groups(EXAMPLES[:1], encoder, generator, 2)
    assert len(rollout.forks) == 2  # one per episode: the second request's context is its own row
    for fork in rollout.forks:
        first, second = generator.records[fork.episode]
        assert fork.prompt == second.context and tokenizer.decode(fork.prompt).endswith("Summary: sure?\nassistant: ")
        assert fork.tokens == second.sampled and fork.sampled == [1] * len(second.sampled)
        assert main_row(rollout, fork.episode)[1] == first.sampled


def test_per_turn_makes_each_reply_its_own_row(model, tokenizer) -> None:
    generator, encoder = agent(model, tokenizer, "ask_and_check", token_mode="per_turn")
    rollout = generate_groups(EXAMPLES[:1], encoder, generator, 2)
    assert [f.episode for f in rollout.forks] == [0, 1]
    for fork in rollout.forks:
        second = generator.records[fork.episode][1]
        assert (fork.prompt, fork.tokens) == (second.context, second.sampled)
    assert rollout.lengths.tolist() == [sum(len(r.sampled) for r in records) for records in generator.records]


def test_requests_past_max_turns_get_an_empty_reply_and_the_episode_keeps_its_turns(model, tokenizer) -> None:
    FINISHES.clear()
    generator, encoder = agent(model, tokenizer, "three_asks", max_turns=2)
    rollout = generate_groups(EXAMPLES[:1], encoder, generator, 1)
    ((reasons, content),) = FINISHES
    assert reasons[2] == "length" and content == ""
    assert rollout.env_columns["env_turns"] == [2] and rollout.env_columns["env_error"] == [None]
    assert len(generator.records[0]) == 2


# ---- the OpenAI format, on a served endpoint --------------------------------------------------------


class Served:
    """An endpoint whose queue this test answers by hand: what a harness sends and gets back."""

    def __init__(self) -> None:
        self.endpoint = AgentEndpoint("policy", request_timeout_s=5.0)

    def post(self, path: str, body: dict[str, Any], key: str | None = None, **headers: str) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.endpoint.port}{path}",
            json.dumps(body).encode(),
            {"Authorization": f"Bearer {key or self.endpoint.api_key}", "Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def answer_next(endpoint: AgentEndpoint, text: str, finish: str = "stop") -> EndpointRequest:
    """Wait for one queued request and answer it with `text`, as the rollout thread does."""
    for _ in range(200):
        taken = endpoint.take()
        if taken:
            request = taken[0]
            request.answer(200, completion_body(request.route, "policy", [(text, finish)], (3, 2)))
            return request
        time.sleep(0.01)
    raise AssertionError("no request came")


def test_sessions_keys_tool_calls_and_streaming_follow_the_openai_format() -> None:
    import threading

    served = Served()
    with served.endpoint as endpoint:
        endpoint.open("s1")
        call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        seen: list[EndpointRequest] = []
        threading.Thread(target=lambda: seen.append(answer_next(endpoint, f"Let me add.{call}")), daemon=True).start()
        status, body = served.post(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "1+2"}]}, **{"X-Session-Id": "s1"}
        )
        assert status == 200 and seen[0].session == "s1"
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me add."
        (tool,) = choice["message"]["tool_calls"]
        assert tool["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
        assert served.post("/v1/chat/completions", {"messages": []}, key="wrong", user="s1")[0] == 401
        assert served.post("/v1/chat/completions", {"messages": [], "user": "nobody"})[0] == 404
        assert served.post("/v1/chat/completions", {"messages": []})[0] == 400  # no session named anywhere

        openai = OpenAI(base_url=endpoint.base_url("s1"), api_key=endpoint.api_key, max_retries=0)
        assert [m.id for m in openai.models.list()] == ["policy"]
        threading.Thread(target=lambda: answer_next(endpoint, "3"), daemon=True).start()
        stream = openai.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1+2"}], stream=True
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "3"
        assert chunks[-1].choices[0].finish_reason == "stop"
        threading.Thread(target=lambda: seen.append(answer_next(endpoint, " 3", "length")), daemon=True).start()
        text = openai.completions.create(model="policy", prompt="1+2=", user="ignored")
        assert text.choices[0].text == " 3" and text.choices[0].finish_reason == "length"
        assert seen[-1].route == "completions" and seen[-1].session == "s1"  # the base URL names the session


def test_a_request_nobody_answers_gets_a_504_after_request_timeout_s() -> None:
    served = Served()
    served.endpoint.request_timeout_s = 0.3
    with served.endpoint as endpoint:
        endpoint.open("s")
        status, body = served.post("/e/s/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 504 and "env.request_timeout_s=0.3s" in body["error"]["message"]
    assert endpoint.queue == []  # withdrawn: the rollout thread will not sample it


def test_n_choices_are_rows_each_cut_at_the_requests_max_tokens_and_the_runs_temperature_governs(
    model, tokenizer, caplog
) -> None:
    FINISHES.clear()
    generator, encoder = agent(model, tokenizer, "two_choices_of_one_token")
    rollout = generate_groups(EXAMPLES[:2], encoder, generator, 1)
    first, second = generator.records[0]
    assert first.context == second.context and len(first.sampled) == len(second.sampled) == 1
    assert all(len(reasons) == 2 and set(reasons) <= {"length", "stop"} for reasons in FINISHES)
    assert [(f.episode, f.prompt, f.tokens) for f in rollout.forks][:1] == [(0, second.context, second.sampled)]
    warned = [r.message for r in caplog.records if "temperature=0.2" in r.message]
    assert len(warned) == 1 and "rollout.temperature=1.0" in warned[0]  # said once, not per request


def test_a_request_the_endpoint_or_the_template_refuses_is_a_400_and_the_episode_goes_on(model, tokenizer) -> None:
    FINISHES.clear()
    strict = copy.copy(tokenizer)
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns here') }}{% endif %}"
        "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    generator, encoder = agent(model, strict, "bad_requests_then_a_good_one")
    rollout = generate_groups(EXAMPLES[:1], encoder, generator, 1)
    empty, tool = FINISHES
    assert "messages must be a non-empty list" in empty and "no tool turns here" in tool
    assert rollout.env_columns["env_error"] == [None] and rollout.env_columns["env_turns"] == [1]


def test_a_request_longer_than_the_model_can_answer_gets_an_empty_reply_and_fails_an_episode_with_no_turn(
    model, tokenizer
) -> None:
    FINISHES.clear()
    generator, encoder = agent(model, tokenizer, "too_long")
    rollout = generate_groups(EXAMPLES[:1], encoder, generator, 1)
    assert FINISHES == [("length", "")]
    (error,) = rollout.env_columns["env_error"]
    assert "none of its 1 requests was sampled: its 318 tokens and a reply of rollout.max_new_tokens=6 pass" in error
    assert "the 256 tokens the run is sized for" in error


def test_tools_reach_the_template_and_a_call_sent_back_is_shown_as_the_model_writes_it(model, tokenizer) -> None:
    native = copy.copy(tokenizer)  # a template that renders tools= (the tiny one's description would not fit)
    native.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    generator, encoder = agent(model, native, "with_tools")
    generate_groups(EXAMPLES[:1], encoder, generator, 1)
    ((record,),) = generator.records
    prompt = tokenizer.decode(record.context)
    assert prompt.startswith("TOOLS:add;user: 1+1=\n")  # the request's tools, through tools=
    assert 'assistant: <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\ntool: 2\n' in prompt
