"""The start-up checks of `env.*` (multi-turn rollouts, docs/environments.md), each a one-line error
naming the key: its values, before any model is built (`validate_env`, from every command that
samples); what the data must hold for the environment to do anything (`check_environment_data`,
once the rows are read); and whether the tools' description fits a prompt (`check_tools_fit`,
once the tokenizer is there).

Its own module because an environment that cannot work trains on nothing and still exits 0: the
checks catch that before the first step instead of a run of empty steps.
"""

from __future__ import annotations

import logging
from typing import Any

from grpo_cli.config.checks import check_choice, fail
from grpo_cli.config.group_keys import check_group_keys
from grpo_cli.config.schema import ENVIRONMENTS, TOKEN_MODES, DataConfig, EnvConfig, RolloutConfig, TrainConfig
from grpo_cli.errors import GrpoError

CODE_TEST_COLUMNS = ("test", "test_list", "io")  # what env=code_feedback runs (one of them per row)
log = logging.getLogger("grpo")
TOOLS_FIT_SAMPLE = 64  # prompts whose length with the tools is measured: the shortest tells


def validate_env(env: EnvConfig) -> None:
    """`env.*`'s values: the environment's name, no key the chosen one ignores (env.max_turns under
    env=none did nothing), and the limits' ranges."""
    check_choice("env.name", env.name, ENVIRONMENTS)
    check_group_keys("env", env)
    if env.name == "none":
        return
    if env.max_turns < 1:
        fail("env.max_turns", env.max_turns, "a trajectory has at least one model turn")
    if env.max_tokens < 0:
        fail("env.max_tokens", env.max_tokens, "must be >= 0 (0: what env.max_turns turns and answers take)")
    if env.max_observation_tokens < 1:
        fail("env.max_observation_tokens", env.max_observation_tokens, "must be at least 1")
    if env.timeout_s <= 0:
        fail("env.timeout_s", env.timeout_s, "must be > 0")
    check_choice("env.token_mode", env.token_mode, TOKEN_MODES)
    if env.name == "agent":
        if env.agent is not None and env.command is not None:  # neither: load_environment (the packaged option)
            fail(
                "env.agent",
                env.agent,
                "env=agent runs one harness per episode: set env.agent=FILE.py:FUNCTION (a Python function "
                "run(base_url, api_key, row)) or env.command='...' (any program), one of the two",
            )
        if env.request_timeout_s <= 0:
            fail("env.request_timeout_s", env.request_timeout_s, "must be > 0")


def check_environment_data(env: EnvConfig, tool_names: list[str], examples: list[dict[str, Any]]) -> None:
    """What the data must hold for the environment to do anything: env=code_feedback runs each row's
    tests (arithmetic rows have none: every reset would fail, every step train on nothing); tools
    are offered through the chat template, which plain-text prompts never go through."""
    if env.name == "code_feedback" and not any(ex.get(c) for ex in examples for c in CODE_TEST_COLUMNS):
        raise GrpoError(
            f"env=code_feedback runs each row's tests, and no row of the data has a {', '.join(CODE_TEST_COLUMNS)} "
            "column: use data=code (reward=code picks it) or data=jsonl with one of those columns"
        )
    if tool_names and examples and not any(isinstance(ex["prompt"], list) for ex in examples):
        raise GrpoError(
            f"env={env.name} offers tools ({', '.join(tool_names)}) through the chat template, and the prompts "
            "are plain text, which never goes through it: add data.chat=true"
        )


def check_tools_fit(cfg: TrainConfig, context: int | None, encoder: Any, prompts: list[Any]) -> None:
    """Whether a model could call the environment's tools at all: the tools' description must fit a
    prompt and one call a model turn. `encoder`: the run's prompt encoder (rollout.prompts.
    PromptEncoder), the tools offered; `context`: the model's positions (None: unknown). Under
    debug=smoke (seconds of plumbing, 8 new tokens) it is a warning: such a run calls no tool anyway."""
    sample = [p for p in prompts if isinstance(p, list)][:TOOLS_FIT_SAMPLE]
    if not encoder.tool_schemas or not sample:
        return
    try:
        _check_description_fits(cfg.env, cfg.data, cfg.rollout, context, encoder.token_counts(sample))
        name = encoder.tool_schemas[0]["function"]["name"]
        call = f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>'  # the shortest call there is
        needed = len(encoder.tokenizer(call, add_special_tokens=False)["input_ids"]) + 1  # and its EOS
        if cfg.rollout.max_new_tokens < needed:
            fail(
                "rollout.max_new_tokens",
                cfg.rollout.max_new_tokens,
                f"env={cfg.env.name}: a model turn must hold a whole tool call, and the shortest ({call!r}) takes "
                f"{needed} tokens with its EOS: raise it to at least {needed} (arguments take more)",
            )
    except GrpoError as err:
        if not cfg.debug.smoke:
            raise
        log.warning("debug=smoke: %s", err)


def _check_description_fits(
    env: EnvConfig, data: DataConfig, rollout: RolloutConfig, context: int | None, counts: list[int]
) -> None:
    """The tools are described at the start of each prompt (a system message or the template's own
    tools block), and a prompt over the budget loses its start: when even the shortest prompt with
    the description is over, no prompt keeps it and no model could ever call a tool."""
    budget, limits = data.max_prompt_tokens, f"data.max_prompt_tokens={data.max_prompt_tokens}"
    if context is not None and context - rollout.max_new_tokens < budget:
        budget = context - rollout.max_new_tokens
        limits += f", within the model's context of {context} less rollout.max_new_tokens={rollout.max_new_tokens}"
    if min(counts) > budget:
        raise GrpoError(
            f"env={env.name}: the tools' description makes every prompt at least {min(counts)} tokens, over the "
            f"prompt budget of {budget} ({limits}): cutting prompts from the left would drop the description, "
            "so no model could ever call a tool; raise data.max_prompt_tokens, or use a model with a longer "
            "context (the tiny model: model.tiny.max_position_embeddings)"
        )
