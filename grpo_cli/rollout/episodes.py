"""Multi-turn rollouts: the model and an environment take turns until the environment says done,
`env.max_turns` model turns have run, or the trajectory's token budget is spent.

A trajectory is one completion to the rest of the pipeline. Its tokens are the model's sampled ids
and the environment's answers as the chat template writes them, in order, never re-tokenized
from text; `Rollout.sampled_mask` is 1 on the model's tokens only, so the loss, the KL, the
entropy and every denominator cover what the model sampled, while attention (completion_mask)
sees the environment's tokens as context. The rewards score the last model turn (`texts`), with
the environment's reward and columns beside it (`env_columns`); the conversation is kept as chat
messages (`messages`) for the completion files and `grpo rollout`.

Every environment call runs on a thread of its own with `env.timeout_s` from its start, at most
`EnvironmentSpec.workers` at once (env=code_feedback: `sandbox.workers`), through the runner
code_tests uses (`grpo_cli.bounded_calls`): a call that raises or does not return in time fails its
row (`env_error`; every reward of that row is None), never the run. A thread that hangs is left
behind (Python cannot stop it), so an environment that hangs every call leaks one thread per row:
the alert names it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_cli.bounded_calls import call_all
from grpo_cli.config.schema import EnvConfig, RolloutConfig, SandboxConfig
from grpo_cli.environments import ENV_ERROR, EnvironmentSpec, load_environment, trajectory_tokens
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Fork, Generator, Rollout, TokenProgress, padded
from grpo_cli.rollout.chat_turns import observation_text, tool_schemas
from grpo_cli.rollout.prompts import PromptEncoder

log = logging.getLogger("grpo")
ENV_REWARD = "env_reward"  # the column of the environment's own reward (`reward()`)
ENV_TURNS = "env_turns"  # the column of model turns per trajectory


@dataclass
class TokenRow:
    """One training row of an episode: the ids the model was given before the row's first turn
    (`prompt`), then every id after them, with which ones the model sampled."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1: the model's token, 0: the environment's
    engine_logps: list[float] = field(default_factory=list)


@dataclass
class Trajectory:
    """One episode's turns so far, as training rows: one row under env.token_mode=append; under fork
    and per_turn a later turn whose context does not extend the row's ids opens another (`continue_from`)."""

    env: Any
    rows: list[TokenRow] = field(default_factory=list)  # rows[0]: the episode's main row, from the data prompt
    prompt: Any = None  # the data prompt (a reset's text added): what token_mode=fork re-renders the history after
    messages: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""  # the last model turn, what the rewards score
    turns: int = 0
    truncated: bool = False
    done: bool = False
    error: str | None = None
    final: tuple[dict[str, Any], float | None] = ({}, None)  # the environment's columns and reward, at the end

    def start(self, prompt: list[int]) -> None:
        self.rows = [TokenRow(list(prompt))]

    @property
    def prompt_len(self) -> int:
        """The data prompt's tokens: the budget (env.max_tokens) counts what comes after them."""
        return len(self.rows[0].prompt)

    def context(self) -> list[int]:
        """What the model is given for its next turn under append: the current row's ids."""
        return self.rows[-1].prompt + self.rows[-1].tokens

    def used(self) -> int:
        """The budget's tokens spent: the current context past the data prompt."""
        return len(self.rows[-1].prompt) + len(self.rows[-1].tokens) - self.prompt_len

    def continue_from(self, context: list[int], new_row: bool = False) -> None:
        """The model's next turn samples from `context`, every id it is given. When `context` starts
        with the current row's ids, the rest is appended as context (not trained on); otherwise (a
        template that rewrote the history, or `new_row`) a new training row opens on it."""
        current = self.context()
        if not new_row and context[: len(current)] == current:
            self.add(context[len(current) :], sampled=False)
        else:
            self.rows.append(TokenRow(list(context)))

    def add(self, ids: list[int], sampled: bool, logps: list[float] | None = None) -> None:
        row = self.rows[-1]
        row.tokens += ids
        row.sampled += [int(sampled)] * len(ids)
        row.engine_logps += logps if logps is not None else [0.0] * len(ids)

    def fail(self, what: str, why: str) -> None:
        self.error, self.done = f"{what}: {why}", True


class EpisodeGenerator:
    """A Generator that runs each prompt's G trajectories with an environment (module docstring).
    The loop that samples each turn is the one `rollout.*` chose (fast, generate or vLLM)."""

    def __init__(
        self,
        inner: Generator,
        tokenizer: Any,
        spec: EnvironmentSpec,
        env: EnvConfig,
        max_new_tokens: int,
        context: int | None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.inner, self.tokenizer, self.spec, self.cfg = inner, tokenizer, spec, env
        self.chat_template_kwargs = dict(chat_template_kwargs or {})  # the prompts' (data.chat_template_kwargs)
        self.max_new_tokens = max_new_tokens
        self.context = context
        self.max_tokens = trajectory_tokens(env, max_new_tokens)
        self.pad_id = tokenizer.pad_token_id
        self._engine_logps = False
        self._encoder: PromptEncoder | None = None  # the run's, for token_mode=fork's renderings
        self._warned_long = False  # a reset's text took a prompt past the budget, under truncate_left

    # ---- the Generator protocol, passed on --------------------------------------------------
    @property
    def on_token(self) -> TokenProgress | None:
        return self.inner.on_token

    @on_token.setter
    def on_token(self, value: TokenProgress | None) -> None:
        self.inner.on_token = value

    def weights_updated(self) -> None:
        self.inner.weights_updated()

    def set_step_seed(self, seed: int) -> None:
        self.inner.set_step_seed(seed)

    def close(self) -> None:
        self.inner.close()

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout:
        raise TypeError("a multi-turn generator needs the prompts' rows: call run(examples, encoder, ...)")

    # ---- trajectories ------------------------------------------------------------------------
    def run(
        self, examples: list[dict[str, Any]], encoder: PromptEncoder, group_size: int, greedy: bool = False
    ) -> Rollout:
        """G trajectories per example, laid out group by group as every Rollout is."""
        g = group_size
        rows = [example for example in examples for _ in range(g)]
        built = call_all([self.spec.new] * len(rows), self.cfg.timeout_s, self.spec.workers)
        trajectories = [Trajectory(env) for env, _ in built]
        for trajectory, (_, why) in zip(trajectories, built):
            if why is not None:
                trajectory.fail(f"building {self.spec.name}", why)
        resets = [self._reset_call(t, row) for t, row in zip(trajectories, rows)]
        resets = call_all(resets, self.cfg.timeout_s, self.spec.workers)
        prompts, grown = [], []
        for i, (trajectory, row, (added, why)) in enumerate(zip(trajectories, rows, resets)):
            if why is not None and trajectory.error is None:
                trajectory.fail("reset", why)
            prompts.append(with_prompt_text(row["prompt"], added if isinstance(added, str) else None))
            if isinstance(added, str) and added and trajectory.error is None:
                grown.append(i)
        self._fit_grown_prompts(trajectories, prompts, grown, encoder)
        first = self._first_turn(prompts, encoder, g, greedy)
        prompt_ids, prompt_mask = first.prompt_ids, first.prompt_mask
        prompt_lists = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
        chat = [isinstance(p, list) for p in prompts]
        for trajectory, ids, prompt in zip(trajectories, prompt_lists, prompts):
            trajectory.start(ids)
            trajectory.prompt = prompt
        self._encoder = encoder  # token_mode=fork renders each later turn's context with it
        self._take_turn(trajectories, list(range(len(rows))), first, chat)
        while True:
            active = [i for i, t in enumerate(trajectories) if not t.done]
            if not active:
                break
            contexts = [torch.tensor(trajectories[i].context(), dtype=torch.long) for i in active]
            ids, mask = padded(contexts, self.pad_id, "left"), padded([torch.ones_like(c) for c in contexts], 0, "left")
            device = prompt_ids.device
            turn = self.inner.generate(ids.to(device), mask.to(device), 1, greedy=greedy)
            self._take_turn(trajectories, active, turn, chat)
        self._finish(trajectories)
        return trajectories_rollout(trajectories, prompt_ids, prompt_mask, g, self.pad_id, self._engine_logps)

    def _reset_call(self, trajectory: Trajectory, row: dict[str, Any]) -> Callable[[], Any]:
        if trajectory.error is not None:
            return lambda: None
        return lambda: trajectory.env.reset(dict(row))

    def _fit_grown_prompts(
        self, trajectories: list[Trajectory], prompts: list[Any], grown: list[int], encoder: PromptEncoder
    ) -> None:
        """data.on_long_prompt for the prompts a reset's text took past the budget, which start-up
        (fit_prompts) could not see: stop (error), fail the row (skip: unscorable, out of the loss),
        or keep the last tokens (truncate_left, as the encoder does) and say so once."""
        counts = encoder.token_counts([prompts[i] for i in grown]) if grown else []
        long = [(i, n) for i, n in zip(grown, counts) if n > encoder.max_tokens]
        if not long:
            return
        budget, policy = encoder.max_tokens, encoder.on_long_prompt
        if policy == "error":
            raise GrpoError(
                f"{len(long)} of {len(prompts)} prompts are longer than {budget} tokens with the text the "
                f"environment's reset() added (the longest has {max(n for _, n in long)}); raise "
                "data.max_prompt_tokens, or set data.on_long_prompt=truncate_left or skip"
            )
        if policy == "skip":
            for i, n in long:
                why = f"the prompt and its text have {n} tokens, over {budget} (data.on_long_prompt=skip)"
                trajectories[i].fail("reset", why)
        elif not self._warned_long:
            self._warned_long = True  # every step would repeat it
            log.warning(
                "%d prompts are longer than %d tokens with the text the environment's reset() added: "
                "truncated from the left (data.on_long_prompt); not repeated",
                len(long),
                budget,
            )

    def _first_turn(self, prompts: list[Any], encoder: PromptEncoder, g: int, greedy: bool) -> Rollout:
        """One prefill per prompt when a group's resets left its prompts alike (the usual case)."""
        firsts = prompts[::g]
        if all(prompts[i] == firsts[i // g] for i in range(len(prompts))):
            ids, mask = encoder(firsts)
            return self.inner.generate(ids, mask, g, greedy=greedy)
        ids, mask = encoder(prompts)
        return self.inner.generate(ids, mask, 1, greedy=greedy)

    def _room(self, trajectory: Trajectory, context: int) -> bool:
        """Whether a next turn's `context` (its length in tokens) and then a whole model turn fit the
        model's context, and the budget (what follows the data prompt) has a token left for that turn."""
        if context - trajectory.prompt_len >= self.max_tokens:
            return False
        return self.context is None or context + self.max_new_tokens <= self.context

    def _take_turn(self, trajectories: list[Trajectory], active: list[int], turn: Rollout, chat: list[bool]) -> None:
        """Each active row's new model turn, then (all rows at once) its environment's answer."""
        lengths, ended = turn.lengths.tolist(), (~turn.truncated).tolist()
        self._engine_logps = turn.engine_logps is not None  # vLLM: the engine's log-probs, kept per token
        for k, i in enumerate(active):
            t = trajectories[i]
            room = self.max_tokens - t.used()
            ids = turn.completion_ids[k, : lengths[k]].tolist()[:room]
            logps = turn.engine_logps[k, : len(ids)].tolist() if turn.engine_logps is not None else None
            t.add(ids, sampled=True, logps=logps)
            cut = len(ids) < lengths[k]  # the budget ran out mid-turn: the rewards see what is trained
            t.text = self.tokenizer.decode(ids, skip_special_tokens=True) if cut else turn.texts[k]
            t.turns += 1
            t.messages.append({"role": "assistant", "content": t.text})
            t.truncated = not ended[k] or cut
        stepping = [i for i in active if trajectories[i].error is None]
        answers = call_all([self._step_call(trajectories[i]) for i in stepping], self.cfg.timeout_s, self.spec.workers)
        for i, (observation, why) in zip(stepping, answers):
            t = trajectories[i]
            if why is not None:
                t.fail("step", why)
                continue
            if observation is None or t.truncated or t.turns >= self.cfg.max_turns:
                t.done = True  # done, cut, or out of turns: an answer now is not shown to the model
                continue
            self._add_observation(t, observation, chat[i])
        for i in active:
            if trajectories[i].error is not None:
                trajectories[i].done = True

    def _step_call(self, trajectory: Trajectory) -> Callable[[], Any]:
        return lambda: trajectory.env.step(trajectory.text)

    def _add_observation(self, t: Trajectory, observation: Any, chat: bool) -> None:
        messages = [{"role": "user", "content": observation}] if isinstance(observation, str) else list(observation)
        if not all(isinstance(m, dict) and "content" in m for m in messages):
            t.fail("step", f"returned {type(observation).__name__}: expected a str, a list of messages or None")
            return
        messages = [self._cut(m) for m in messages]
        context = self._next_context(t, messages, chat)
        if not self._room(t, len(context)):
            t.truncated = t.done = True  # no room for the answer and a turn: the trajectory ends at the model's turn
            return
        t.continue_from(context, new_row=self.cfg.token_mode == "per_turn")
        t.messages += messages

    def _next_context(self, t: Trajectory, messages: list[dict[str, Any]], chat: bool) -> list[int]:
        """The ids the next model turn samples from (env.token_mode). append: the row's ids, then the
        template's text between the turn and the next (only that is tokenized), so the model keeps its
        own tokens and whatever the template would rewrite. fork and per_turn: the whole conversation as
        the chat template renders it, as the model sees it at inference (a Qwen3-style template drops
        earlier reasoning). A plain-text prompt has no template to re-render: its context appends."""
        if self.cfg.token_mode == "append" or not chat:
            return self.appended(t.context(), messages, chat)
        return self._encoder.token_ids([*t.prompt, *t.messages, *messages])

    def appended(self, context: list[int], messages: list[dict[str, Any]], chat: bool) -> list[int]:
        """`context` (ending with the model's turn), then the ids of the template's text for `messages`
        and the next turn's opening: only that text is tokenized (env.token_mode=append)."""
        eos_text = self.tokenizer.decode(context[-1:], skip_special_tokens=False)
        text = observation_text(self.tokenizer, messages, chat, eos_text, self.chat_template_kwargs)
        return context + self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _cut(self, message: dict[str, Any]) -> dict[str, Any]:
        """A message whose content is over env.max_observation_tokens keeps its first tokens."""
        content = str(message["content"])
        ids = self.tokenizer(content, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.cfg.max_observation_tokens:
            return {**message, "content": content}
        kept = self.tokenizer.decode(ids[: self.cfg.max_observation_tokens], skip_special_tokens=True)
        return {**message, "content": kept + " [cut]"}

    def _finish(self, trajectories: list[Trajectory]) -> None:
        """The environments' rewards and columns, once every trajectory has ended."""
        calls = [self._final_call(t) for t in trajectories]
        for t, (value, why) in zip(trajectories, call_all(calls, self.cfg.timeout_s, self.spec.workers)):
            if why is not None and t.error is None:
                t.fail("reward", why)
            if why is None:
                t.final = value

    @staticmethod
    def _final_call(t: Trajectory) -> Callable[[], tuple[dict[str, Any], float | None]]:
        def final() -> tuple[dict[str, Any], float | None]:
            if t.error is not None:
                return {}, None
            columns = t.env.columns() if callable(getattr(t.env, "columns", None)) else {}
            reward = t.env.reward() if callable(getattr(t.env, "reward", None)) else None
            return dict(columns or {}), None if reward is None else float(reward)

        return final


def trajectories_rollout(
    trajectories: list[Trajectory],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group_size: int,
    pad_id: int,
    engine_logps: bool,
) -> Rollout:
    """The Rollout of finished trajectories: each episode's main row (its first) as the row of its
    group, the rows a fork opened after it as `Rollout.forks`, and the environments' columns."""

    def right(rows: list[list[Any]], dtype: torch.dtype, fill: float) -> torch.Tensor:
        return padded([torch.tensor(row, dtype=dtype) for row in rows], fill, width=1)  # one column at least

    mains = [t.rows[0] for t in trajectories]
    ids = right([r.tokens for r in mains], torch.long, pad_id)
    real = right([[1] * len(r.tokens) for r in mains], torch.long, 0)
    sampled = right([r.sampled for r in mains], torch.long, 0)
    logps = right([r.engine_logps for r in mains], torch.float32, 0.0)
    forks = [
        Fork(i, row.prompt, row.tokens, row.sampled, row.engine_logps)
        for i, t in enumerate(trajectories)
        for row in t.rows[1:]
    ]
    finals = [t.final for t in trajectories]
    names = list(dict.fromkeys(name for columns, _ in finals for name in columns))
    columns: dict[str, list[Any]] = {name: [c.get(name) for c, _ in finals] for name in names}
    columns[ENV_REWARD] = [reward for _, reward in finals]
    columns[ENV_ERROR] = [t.error for t in trajectories]
    columns[ENV_TURNS] = [t.turns for t in trajectories]
    device = prompt_ids.device
    return Rollout(
        prompt_ids,
        prompt_mask,
        ids.to(device),
        real.to(device),
        torch.tensor([t.truncated for t in trajectories], device=device),
        [t.text for t in trajectories],
        group_size,
        logps.to(device) if engine_logps else None,
        sampled.to(device),
        [t.messages for t in trajectories],
        columns,
        [getattr(t.env, "obj", t.env) for t in trajectories],  # a TRL class's instance, not its adapter
        forks or None,
    )


def with_prompt_text(prompt: Any, added: str | None) -> Any:
    """The prompt with a reset's text added to its last user message (to a plain prompt's end)."""
    if not added:
        return prompt
    if isinstance(prompt, str):
        return f"{prompt}\n\n{added}"
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return [*messages, {"role": "user", "content": added}]
    messages[users[-1]]["content"] = f"{messages[users[-1]]['content']}\n\n{added}"
    return messages


def with_environment(
    generator: Generator,
    encoder: PromptEncoder,
    tokenizer: Any,
    env: EnvConfig,
    sandbox: SandboxConfig,
    rollout: RolloutConfig,
    context: int | None,
) -> tuple[Generator, str | None]:
    """The generator train, rollout and eval sample with: multi-turn when `env.name` is not none
    (its tools offered through `encoder`), with a line for the start-up log; else unchanged."""
    spec = load_environment(env, sandbox)
    if spec is None:
        return generator, None
    if env.name == "agent":  # the harness's requests, served by an endpoint (rollout/agent_episodes.py)
        from grpo_cli.rollout.agent_episodes import agent_generator

        return agent_generator(generator, tokenizer, spec, env, rollout, context, encoder.chat_template_kwargs)
    schemas = tool_schemas(spec.tools)
    encoder.offer_tools(schemas)
    episodes = EpisodeGenerator(
        generator, tokenizer, spec, env, rollout.max_new_tokens, context, encoder.chat_template_kwargs
    )
    tools = f", tools: {', '.join(s['function']['name'] for s in schemas)}" if schemas else ""
    line = f"{spec.name} (up to {env.max_turns} model turns, {episodes.max_tokens} tokens after the prompt{tools})"
    return episodes, line
