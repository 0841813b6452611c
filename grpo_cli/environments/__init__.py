"""Multi-turn rollouts' environments (docs/environments.md): which one `env.*` names, built per trajectory."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_cli.config.env_checks import check_environment_data, validate_env
from grpo_cli.config.schema import ENVIRONMENTS, EnvConfig, SandboxConfig
from grpo_cli.environments.base import Environment, ToolEnvironment, TRLEnvironment
from grpo_cli.errors import GrpoError

__all__ = [
    "COLUMNS",
    "ENVIRONMENTS",
    "ENV_ERROR",
    "Environment",
    "EnvironmentSpec",
    "environment_columns",
    "load_environment",
    "longest_prompt",
    "trajectory_tokens",
]
TEMPLATE_TOKENS = 16  # the chat template's tokens around one environment answer (role markers, EOS)


@dataclass
class EnvironmentSpec:
    """How to build one trajectory's environment, and what the prompt offers the model."""

    name: str  # env.name, for logs and errors
    new: Callable[[], Any]  # a fresh environment object
    tools: list[Callable[..., Any]]  # offered through the chat template ([] for none)
    columns: tuple[str, ...] = ()  # per-row columns beyond the ones every environment reports (COLUMNS)
    workers: int | None = None  # at most this many of its calls at once (bounded_calls); None: every row at once


def trajectory_tokens(env: EnvConfig, max_new_tokens: int) -> int:
    """The most tokens a completion holds after its prompt: one turn's for env=none, else
    `env.max_tokens`, or (0) every model turn's and every environment answer between them. The
    episode loop stops at it, and the memory plan and vLLM's context are sized by it.

    >>> calculator = EnvConfig(name="calculator", max_turns=3, max_observation_tokens=48)
    >>> trajectory_tokens(EnvConfig(), 64), trajectory_tokens(calculator, 64)
    (64, 320)
    """
    if env.name == "none":
        return max_new_tokens
    between = (env.max_turns - 1) * (env.max_observation_tokens + TEMPLATE_TOKENS)
    return env.max_tokens or env.max_turns * max_new_tokens + between


def longest_prompt(max_prompt_tokens: int, env: EnvConfig, max_new_tokens: int) -> int:
    """The longest prompt one generate call can get: a later turn's prompt holds the turns before it."""
    return max_prompt_tokens + trajectory_tokens(env, max_new_tokens) - max_new_tokens


# A multi-turn rollout's column: why the row's environment failed, None where it did not. Here, where the
# rollout that writes it and the rewards that read it may both import it (generation knows nothing of scoring).
ENV_ERROR = "env_error"
COLUMNS = ("env_reward", ENV_ERROR, "env_turns")  # what every trajectory reports to the reward functions
TOOL_COLUMNS = ("env_tool_calls", "env_tool_errors")  # ToolEnvironment.columns()


def environment_columns(
    env: EnvConfig, sandbox: SandboxConfig, examples: list[dict[str, Any]] | None = None
) -> list[str]:
    """The columns a run's reward functions get from its environment beyond the data's (none for
    env=none), so start-up can check the functions' signatures against them. Given the data's
    rows (`examples`), also whether they hold what the environment needs (code_feedback's tests, a
    conversation for tools), so a run that could only train on nothing fails now."""
    spec = load_environment(env, sandbox)
    if spec is None:
        return []
    if examples is not None:
        check_environment_data(env, [tool.__name__ for tool in spec.tools], examples)
    return [*COLUMNS, *spec.columns]


def _import(target: str, what: str) -> Any:
    from grpo_cli.rewards.sources import import_module_here

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise GrpoError(f"env.{what}={target!r}: expected an import path 'package.module:Name'")
    try:
        module = import_module_here(module_name)
    except ImportError as err:
        raise GrpoError(f"env.{what}={target!r}: cannot import {module_name}: {err}") from None
    if not hasattr(module, attr):
        raise GrpoError(f"env.{what}={target!r}: {module_name} has no attribute {attr}")
    return getattr(module, attr)


def _build(cls: type, kwargs: dict[str, Any], env: EnvConfig) -> Any:
    """One instance of the user's class, built as each trajectory's will be: a class that cannot be
    built so fails here in one line naming env.target, not on every row of every step."""
    how = "with no arguments (TRL builds it so)" if env.name == "trl" else f"with env.kwargs={kwargs}"
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as err:
        raise GrpoError(f"env.target={env.target!r} cannot be built {how}: {err}") from None
    except ValueError:  # no signature to read (a class written in C): building it says
        pass
    try:
        return cls(**kwargs)
    except Exception as err:  # the user's __init__: its failure, in one line
        raise GrpoError(f"env.target={env.target!r}: building it {how} raised {type(err).__name__}: {err}") from None


def load_environment(env: EnvConfig, sandbox: SandboxConfig) -> EnvironmentSpec | None:
    """The spec for `env.name`, or None for `env=none` (one model turn, as without environments).
    Everything a typo would break is checked here, before any model loads: the target imports, a
    class builds, tools have the type hints and docstrings their schemas need."""
    from grpo_cli.environments.builtin import CalculatorEnvironment, CodeFeedbackEnvironment
    from grpo_cli.rollout.chat_turns import tool_schemas

    validate_env(env)  # a library caller may not have run the command's checks
    if env.name == "none":
        return None
    # here, not in validate_env: the packaged options are composed and validated without a target
    if env.name in ("custom", "trl") and not env.target:
        raise GrpoError(f"env={env.name} needs env.target=module:Class (the environment class)")
    if env.name == "tools" and not env.tools:
        raise GrpoError("env=tools needs env.tools=[module:function,...] (the tool functions)")
    if env.name == "agent":  # the user's harness drives the episode: no environment object, no tools
        from grpo_cli.environments.agent import load_harness

        if env.agent is None and env.command is None:  # here, as env.target: the packaged option names neither
            raise GrpoError(
                "env=agent runs one harness per episode: set env.agent=FILE.py:FUNCTION (a Python function "
                "run(base_url, api_key, row)) or env.command='...' (any program)"
            )

        return EnvironmentSpec(f"agent {load_harness(env).name}", lambda: None, [])
    if env.name == "calculator":
        spec = EnvironmentSpec("calculator", CalculatorEnvironment, CalculatorEnvironment().tools, TOOL_COLUMNS)
    elif env.name == "code_feedback":
        columns = ("env_turn_scores",)
        workers = CodeFeedbackEnvironment.workers(sandbox)  # sandbox.workers sessions at once, as code_tests
        spec = EnvironmentSpec("code_feedback", lambda: CodeFeedbackEnvironment(sandbox), [], columns, workers)
    elif env.name == "tools":
        functions = [_import(target, "tools") for target in env.tools]
        spec = EnvironmentSpec("tools", lambda: ToolEnvironment(functions), functions, TOOL_COLUMNS)
    else:
        cls = _import(str(env.target), "target")
        if not inspect.isclass(cls):
            raise GrpoError(f"env.target={env.target!r} is not a class")
        if env.name == "trl":
            if not callable(getattr(cls, "reset", None)):
                raise GrpoError(
                    f"env.target={env.target!r}: a TRL environment class needs reset(**row), which TRL calls "
                    "before every episode; it has none"
                )
            tools = TRLEnvironment(_build(cls, {}, env)).tools
            spec = EnvironmentSpec(f"trl:{env.target}", lambda: TRLEnvironment(cls()), tools, TOOL_COLUMNS)
        else:
            missing = [name for name in ("reset", "step") if not callable(getattr(cls, name, None))]
            if missing:
                raise GrpoError(
                    f"env.target={env.target!r}: an environment needs reset(example) and step(completion); "
                    f"it has no {' or '.join(missing)} (a TRL environment class: env=trl)"
                )
            kwargs = dict(env.kwargs)
            tools = list(getattr(_build(cls, kwargs, env), "tools", None) or [])
            names = tuple(getattr(cls, "column_names", ()))  # the keys its columns() returns, declared
            spec = EnvironmentSpec(f"custom:{env.target}", lambda: cls(**kwargs), tools, names)
    tool_schemas(spec.tools)  # a tool without hints or docstring fails now, naming it
    return spec
