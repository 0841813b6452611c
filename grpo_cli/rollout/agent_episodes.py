"""env=agent: the agent a user already wrote runs once per episode against an OpenAI-compatible
endpoint backed by the policy (`rollout/agent_endpoint.py`), and the episode's training rows are
built from what the endpoint sampled, never from the text the harness sends back.

A rollout starts the endpoint and G harnesses per prompt, each on its own thread with its own base
URL (`/e/<episode>/v1`). Their requests queue; this, the rollout's thread, samples them in batches
with the run's loop and knobs: a batch goes when every live episode waits on a request (or has
ended), or `BATCH_WINDOW_S` after the first request queued, whichever comes first.

Each request's context, the ids the model samples from (`env.token_mode`):
- append: when the request's messages are the episode's last request's plus the reply it got, then
  what the harness added, the context is the last context, the ids sampled, and the chat template's
  text for the added messages (`observation_text`: only that is tokenized); otherwise the harness
  rewrote the history, and the whole conversation as the template renders it opens a new row;
- fork: always the whole rendering; a new row only where it does not extend the row so far;
- per_turn: the whole rendering, every model turn a row of its own.
A completions request (`/v1/completions`, text) has no template to re-render: a prompt that extends
the last prompt and its reply appends under every mode (per_turn still opens a row per turn).
The model's tokens have loss mask 1, everything the harness wrote mask 0 (`Trajectory`). A request
past env.max_turns, past the token budget, or whose context and a reply pass what the run is sized
for (the prompt budget and the episode's, within the model's positions) gets an empty reply with
finish_reason "length": the episode keeps what it has.

The rewards score the last reply (`texts`), see the whole transcript (`messages`), and get the
harness's return value as `env_reward`. A harness that raises, outlives env.timeout_s, or returns
without a request costs its episode only (env_error names it); a hung one's thread is left behind.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_cli.config.schema import EnvConfig, RolloutConfig
from grpo_cli.environments import EnvironmentSpec
from grpo_cli.environments.agent import Harness, load_harness
from grpo_cli.rollout.agent_endpoint import (
    AgentEndpoint,
    EndpointRequest,
    completion_body,
    error_body,
    same_messages,
    template_message,
)
from grpo_cli.rollout.base import Generator, Rollout, padded
from grpo_cli.rollout.chat_turns import render_prompt, renders_tools
from grpo_cli.rollout.episodes import EpisodeGenerator, Trajectory, trajectories_rollout
from grpo_cli.rollout.prompts import PromptEncoder

log = logging.getLogger("grpo")
# How long the first queued request waits for the other episodes' before a batch is sampled anyway: a
# harness between its requests (reading a reply, running a tool) is usually quicker; a batch goes at once
# when every live episode is waiting
BATCH_WINDOW_S = 0.05
MAX_CHOICES = 64  # a request's `n`: each choice is a row to sample and train, so one request cannot fill the memory
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "openai")  # quieted to warnings unless the user set their level


class RequestError(ValueError):
    """A request the endpoint cannot sample (no messages, a malformed tool): a 400 to the harness."""


@dataclass
class Record:
    """What the endpoint sampled for one choice of one request: the ids the model was given, the
    ids it sampled (cut as the harness saw them) and the sampler's log-probs of them."""

    context: list[int]
    sampled: list[int]
    logps: list[float]
    finish_reason: str


@dataclass
class Episode:
    """One harness run: its session on the endpoint and the trajectory its requests build."""

    id: str
    row: dict[str, Any]
    trajectory: Trajectory
    deadline: float
    result: tuple[float | None, str | None] | None = None  # (reward, why it failed), once the harness returned
    over: bool = False
    requests: int = 0
    refused: str | None = None  # why the last request got an empty reply
    last_chat: list[dict[str, Any]] | None = None  # the last chat request's messages and the reply it got
    last_text: str | None = None  # completions: the last prompt and the text it got
    last_context: list[int] = field(default_factory=list)  # the last reply's context and sampled ids
    records: list[Record] = field(default_factory=list)


@dataclass
class Sampled:
    """One generate call's rows as lists, read once for every request it answers."""

    ids: list[list[int]]
    lengths: list[int]
    ended: list[bool]  # the row ended with an EOS
    rollout: Rollout  # for its engine log-probs (vLLM), sliced per row


@dataclass
class Plan:
    """A request to sample: its episode, context, choices and reply limit."""

    request: EndpointRequest
    episode: Episode
    context: list[int]
    new_row: bool
    n: int
    limit: int  # tokens the reply may have (the request's max_tokens, at most the run's)


class AgentEpisodeGenerator(EpisodeGenerator):
    """The EpisodeGenerator of env=agent (module docstring): `run` serves the harnesses' requests."""

    def __init__(
        self,
        inner: Generator,
        tokenizer: Any,
        spec: EnvironmentSpec,
        env: EnvConfig,
        harness: Harness,
        sampling: tuple[int, float, float],
        context: int | None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        max_new_tokens, self.temperature, self.top_p = sampling  # the run's rollout.*: training needs them
        super().__init__(inner, tokenizer, spec, env, max_new_tokens, context, chat_template_kwargs)
        self.harness = harness
        self.model_name = str(getattr(tokenizer, "name_or_path", "") or "policy").rstrip("/").split("/")[-1]
        self._native_tools: bool | None = None  # whether the template shows tools=, probed at the first tools
        self.batch_sizes: list[int] = []  # requests per generate call, this run's so far
        self.records: list[list[Record]] = []  # the last rollout's, per episode: what the endpoint sampled
        self._warned: set[str] = set()
        self._longest: float = math.inf  # run() sets it from the prompt budget
        for name in HTTP_CLIENT_LOGGERS:  # the harnesses' HTTP clients log each request at INFO: hundreds a step
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)

    def run(
        self, examples: list[dict[str, Any]], encoder: PromptEncoder, group_size: int, greedy: bool = False
    ) -> Rollout:
        """G episodes per example, each its harness's, laid out group by group as every Rollout is."""
        rows = [example for example in examples for _ in range(group_size)]
        # the longest sequence the memory plan and vLLM's context were sized for (environments.longest_prompt)
        self._longest = min(self.context or math.inf, encoder.max_tokens + self.max_tokens)
        prefix = secrets.token_hex(4)
        with AgentEndpoint(self.model_name, self.cfg.request_timeout_s) as endpoint:
            start = time.monotonic()
            episodes = [
                Episode(f"{prefix}-{i}", dict(row), Trajectory(None), start + self.cfg.timeout_s)
                for i, row in enumerate(rows)
            ]
            try:
                for episode in episodes:
                    endpoint.open(episode.id)
                    self._start_harness(episode, endpoint)
                while (batch := self._next_batch(endpoint, episodes)) is not None:
                    self._serve(batch, {e.id: e for e in episodes}, greedy, encoder.device)
            finally:
                self.harness.stop()  # a rollout cut short (Ctrl-C) leaves no command running
        self.records = [e.records for e in episodes]
        trajectories = [self._finished(e, encoder) for e in episodes]
        prompts = [torch.tensor(t.rows[0].prompt, dtype=torch.long) for t in trajectories]
        prompt_ids = padded(prompts, self.pad_id, "left").to(encoder.device)
        prompt_mask = padded([torch.ones_like(p) for p in prompts], 0, "left").to(encoder.device)
        return trajectories_rollout(trajectories, prompt_ids, prompt_mask, group_size, self.pad_id, self._engine_logps)

    # ---- the harnesses -----------------------------------------------------------------------
    def _start_harness(self, episode: Episode, endpoint: AgentEndpoint) -> None:
        url, key, row, timeout = endpoint.base_url(episode.id), endpoint.api_key, dict(episode.row), self.cfg.timeout_s

        def run() -> None:
            try:
                result: tuple[float | None, str | None] = self.harness.run(url, key, row, timeout), None
            except BaseException as err:  # the user's agent: whatever it raises is its episode's failure
                result = None, f"raised {type(err).__name__}: {err}"
            with endpoint.changed:  # an episode ended at its deadline keeps that reason
                if not episode.over:
                    episode.result = result
                endpoint.changed.notify_all()

        threading.Thread(target=run, daemon=True, name="grpo-agent").start()

    def _end_episodes(self, endpoint: AgentEndpoint, episodes: list[Episode]) -> None:
        """Episodes whose harness returned, or whose env.timeout_s is past, are over: their sessions close."""
        now = time.monotonic()
        for e in episodes:
            if e.over or (e.result is None and now < e.deadline):
                continue
            e.over = True
            if e.result is None:
                left = "killed" if self.harness.killed_on_timeout else "its thread is left behind"
                e.result = None, f"did not return within env.timeout_s={self.cfg.timeout_s:g}s ({left})"
            endpoint.close_session(e.id, e.result[1] or "the agent returned")

    def _finished(self, e: Episode, encoder: PromptEncoder) -> Trajectory:
        """The episode's trajectory, failed with the reason where its harness failed it."""
        t, (reward, why) = e.trajectory, e.result or (None, None)
        if not t.rows:  # no request was sampled: a row of the data prompt, for the layout only
            t.start(encoder.token_ids(e.row["prompt"])[-encoder.max_tokens :])
        if why is None and e.requests == 0:
            why = "returned without a request to the endpoint (was its client given the base_url and api_key?)"
        elif why is None and t.turns == 0:
            why = f"none of its {e.requests} requests was sampled: {e.refused}"
        if why is not None:
            t.fail(f"agent {self.harness.name}", why)
        else:
            t.final, t.done = ({}, reward), True
        return t

    # ---- batches -------------------------------------------------------------------------------
    def _next_batch(self, endpoint: AgentEndpoint, episodes: list[Episode]) -> list[EndpointRequest] | None:
        """The next batch of requests, when due (module docstring); None once every episode is over."""
        with endpoint.changed:
            while True:
                self._end_episodes(endpoint, episodes)
                live = {e.id for e in episodes if not e.over}
                queued, now = endpoint.queue, time.monotonic()
                if not live and not queued:
                    return None
                wake = min([e.deadline for e in episodes if not e.over], default=math.inf)
                if queued:
                    if live <= {r.session for r in queued} or now >= queued[0].arrived + BATCH_WINDOW_S:
                        return endpoint.take()
                    wake = min(wake, queued[0].arrived + BATCH_WINDOW_S)
                endpoint.changed.wait(None if wake == math.inf else max(0.0, wake - now))

    def _serve(self, batch: list[EndpointRequest], episodes: dict[str, Episode], greedy: bool, device: Any) -> None:
        """Plan each request (its context, or an answer without sampling), sample the plans in one
        call, and answer each with its choices while recording them in its episode's rows."""
        plans = []
        for request in batch:
            episode = episodes.get(request.session)
            if episode is None or episode.over:
                request.answer(409, error_body(f"episode {request.session} is over"))
                continue
            episode.requests += 1
            try:
                plan = self._plan(request, episode)
            except Exception as err:  # the request's own fault: malformed, or a conversation the template refuses
                why = str(err) if isinstance(err, RequestError) else f"{type(err).__name__}: {err}"
                request.answer(400, error_body(why))
                continue
            if plan is not None:
                plans.append(plan)
        if not plans:
            return
        contexts = [torch.tensor(p.context, dtype=torch.long) for p in plans for _ in range(p.n)]
        ids = padded(contexts, self.pad_id, "left").to(device)
        mask = padded([torch.ones_like(c) for c in contexts], 0, "left").to(device)
        turn = self.inner.generate(ids, mask, 1, greedy=greedy)
        self.batch_sizes.append(len(plans))
        self._engine_logps = turn.engine_logps is not None  # vLLM: the engine's log-probs, kept per token
        sampled = Sampled(turn.completion_ids.tolist(), turn.lengths.tolist(), (~turn.truncated).tolist(), turn)
        k = 0
        for plan in plans:
            self._answer(plan, sampled, range(k, k + plan.n))
            k += plan.n

    def _plan(self, request: EndpointRequest, e: Episode) -> Plan | None:
        """The request's context and limits, or None where it was answered without sampling."""
        body, t = request.body, e.trajectory
        self._check_knobs(body)
        context, extends = self._chat_context(body, e) if request.route == "chat" else self._text_context(body, e)
        n = int(body.get("n") or 1)
        if n > MAX_CHOICES:
            raise RequestError(f"n={n}: at most {MAX_CHOICES} choices a request")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        limit = min(self.max_new_tokens, int(asked))
        if n < 1 or limit < 1:
            raise RequestError(f"n={n} and max_tokens={limit} must be at least 1")
        room = not t.rows or len(context) - t.prompt_len < self.max_tokens
        if t.turns >= self.cfg.max_turns:
            e.refused = f"env.max_turns={self.cfg.max_turns} model turns were taken"
        elif not room:
            e.refused = f"the episode's budget of {self.max_tokens} tokens after its first prompt is spent"
        elif len(context) + self.max_new_tokens > self._longest:
            e.refused = (
                f"its {len(context)} tokens and a reply of rollout.max_new_tokens={self.max_new_tokens} pass the "
                f"{self._longest} tokens the run is sized for (data.max_prompt_tokens + the episode's budget, "
                "within the model's positions)"
            )
        else:
            return Plan(request, e, context, self._new_row(extends), n, limit)
        if t.rows and not e.refused.startswith("env.max_turns"):
            t.truncated = True  # the harness wanted a turn that did not fit: the episode is cut
        usage = (len(context), 0)
        request.answer(200, completion_body(request.route, self.model_name, [("", "length")] * n, usage))
        return None

    def _new_row(self, extends: bool) -> bool:
        mode = self.cfg.token_mode
        return mode == "per_turn" or (mode == "append" and not extends)

    def _check_knobs(self, body: dict[str, Any]) -> None:
        """The run's sampling governs (the policy gradient needs the sampled distribution): a request
        asking otherwise is sampled the run's way, said once per knob."""
        for knob, run_value in (("temperature", self.temperature), ("top_p", self.top_p)):
            asked = body.get(knob)
            if asked is not None and float(asked) != run_value and knob not in self._warned:
                self._warned.add(knob)
                log.warning(
                    "env=agent: a request asked for %s=%s; the run samples with rollout.%s=%s, which training "
                    "needs (not repeated)",
                    knob,
                    asked,
                    knob,
                    run_value,
                )
        if body.get("stop") and "stop" not in self._warned:
            self._warned.add("stop")
            log.warning("env=agent: a request's stop sequences are not applied: turns end at EOS (not repeated)")

    # ---- contexts ----------------------------------------------------------------------------
    def _chat_context(self, body: dict[str, Any], e: Episode) -> tuple[list[int], bool]:
        """(context, whether it extends the last reply's) of a chat request (module docstring)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of message objects")
        tools = body.get("tools") or None
        if tools is not None and not all(isinstance(s, dict) and isinstance(s.get("function"), dict) for s in tools):
            raise RequestError('each tool must be {"type": "function", "function": {...}}')
        last = e.last_chat
        if self.cfg.token_mode == "append" and last is not None and same_messages(messages[: len(last)], last):
            return self.appended(e.last_context, [template_message(m) for m in messages[len(last) :]], True), True
        if tools is not None and self._native_tools is None:  # not before: a base model has no template to probe
            self._native_tools = renders_tools(self.tokenizer, self.chat_template_kwargs)
        rendered = [template_message(m) for m in messages]
        text = render_prompt(self.tokenizer, rendered, tools, bool(self._native_tools), self.chat_template_kwargs)
        return self._ids(text, False), False

    def _text_context(self, body: dict[str, Any], e: Episode) -> tuple[list[int], bool]:
        """(context, whether it extends the last reply's) of a completions request: a text prompt, or its ids."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = body["prompt"] = prompt[0]  # the SDK's list of one prompt
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            if not all(0 <= i < len(self.tokenizer) for i in prompt):
                raise RequestError(f"prompt token ids must be in [0, {len(self.tokenizer)}): the tokenizer's")
            return list(prompt), False
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("prompt must be one non-empty string (or a list of token ids)")
        last = e.last_text
        if last is not None and prompt.startswith(last):  # no template to re-render: every mode appends
            return e.last_context + self._ids(prompt[len(last) :], False), True
        return self._ids(prompt, True), False  # a plain prompt gets the tokenizer's special tokens, as data prompts

    def _ids(self, text: str, special: bool) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special)["input_ids"] if text else []

    # ---- answers -----------------------------------------------------------------------------
    def _answer(self, plan: Plan, turn: Sampled, rows: range) -> None:
        """Answer the harness with each choice, then (unless it was told 504 first) record them in the
        episode's rows, the first continuing it and any other a row of its own, and keep the
        conversation for the next request's context."""
        e, t, body = plan.episode, plan.episode.trajectory, plan.request.body
        room = self.max_tokens - (len(plan.context) - (t.prompt_len if t.rows else len(plan.context)))
        logprobs, records = turn.rollout.engine_logps, []
        for k in rows:
            ids = turn.ids[k][: turn.lengths[k]][: min(plan.limit, room)]
            logps = logprobs[k, : len(ids)].tolist() if logprobs is not None else [0.0] * len(ids)
            finish = "length" if len(ids) < turn.lengths[k] or not turn.ended[k] else "stop"
            records.append(Record(list(plan.context), ids, logps, finish))
        texts = [self.tokenizer.decode(r.sampled, skip_special_tokens=True) for r in records]
        usage = (len(plan.context), sum(len(r.sampled) for r in records))
        reply = completion_body(
            plan.request.route, self.model_name, [(x, r.finish_reason) for x, r in zip(texts, records)], usage
        )
        if not plan.request.answer(200, reply):
            return  # the harness was told 504 (env.request_timeout_s): it never sees this reply
        for j, record in enumerate(records):
            if not t.rows:
                t.start(plan.context)
            else:
                t.continue_from(plan.context, new_row=plan.new_row or j > 0)
            t.add(record.sampled, sampled=True, logps=record.logps)
        e.records += records
        t.turns, t.text, t.truncated = t.turns + 1, texts[0], records[0].finish_reason == "length"
        e.last_context = plan.context + records[0].sampled
        if plan.request.route == "chat":
            e.last_chat = [*body["messages"], reply["choices"][0]["message"]]
            asked = [template_message(m) for m in body["messages"]]
        else:
            prompt = body["prompt"]
            e.last_text = prompt + texts[0] if isinstance(prompt, str) else None
            asked = [{"role": "user", "content": prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)}]
        t.messages = [*asked, {"role": "assistant", "content": texts[0]}]  # the model's turns as it wrote them


def agent_generator(
    generator: Generator,
    tokenizer: Any,
    spec: EnvironmentSpec,
    env: EnvConfig,
    rollout: RolloutConfig,
    context: int | None,
    chat_template_kwargs: dict[str, Any],
) -> tuple[AgentEpisodeGenerator, str]:
    """`with_environment`'s generator for env=agent, with its line for the start-up log."""
    sampling = (rollout.max_new_tokens, rollout.temperature, rollout.top_p)
    episodes = AgentEpisodeGenerator(
        generator, tokenizer, spec, env, load_harness(env), sampling, context, chat_template_kwargs
    )
    line = (
        f"{spec.name} through an OpenAI-compatible endpoint on 127.0.0.1 (up to {env.max_turns} model turns, "
        f"{episodes.max_tokens} tokens after the first prompt, env.token_mode={env.token_mode})"
    )
    return episodes, line
