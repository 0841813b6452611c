"""What an environment is to the rollout: a small protocol, and the adapters that give TRL's
environment classes and plain tool functions that protocol unchanged.

Each trajectory gets its own environment object (G of them per prompt), so state never leaks
between the completions of a group. The rollout calls, with a deadline on each call:

- `reset(example) -> str | None`: the data set's row; text returned is added to the prompt's last
  user message (to the text of a plain prompt);
- `step(completion) -> observation | None`, after every model turn, the last one included: the
  messages that follow the turn (a str is one user message; a list of {"role", "content"} dicts,
  e.g. tool results), or None when the trajectory is done. After the last allowed turn the
  environment still sees the turn, and what it returns then is not shown to the model;
- optional `reward() -> float | None` once the trajectory ends: the `env_reward` reward function's
  value for the row; optional `columns() -> dict`: values reward functions read as columns;
- optional `tools`: functions offered to the model through the chat template.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, Protocol

TRL_RESERVED = frozenset({"reset", "get_reward"})  # methods of a TRL environment that are not tools


class Environment(Protocol):
    def reset(self, example: dict[str, Any]) -> str | None: ...

    def step(self, completion: str) -> str | list[dict[str, Any]] | None: ...


def call_tool(tools: dict[str, Callable[..., Any]], call: dict[str, Any]) -> dict[str, Any]:
    """One parsed tool call's result as a tool message. A wrong call (unknown tool, bad arguments,
    a tool that raises) is the model's mistake, not the environment's: its error is the result,
    so the model can read it and try again, as TRL does."""
    if "error" in call:
        return {"role": "tool", "name": "error", "content": f"error: {call['error']}"}
    name, arguments = call["name"], call["arguments"]
    tool = tools.get(name)
    if tool is None:
        return {"role": "tool", "name": name, "content": f"error: no tool named {name!r} (tools: {', '.join(tools)})"}
    try:
        result = tool(**arguments)
    except Exception as err:  # the tool's own failure on the model's arguments
        return {"role": "tool", "name": name, "content": f"error: {type(err).__name__}: {err}"}
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    return {"role": "tool", "name": name, "content": content}


class ToolEnvironment:
    """Plain tool functions (`env=tools`, `env=calculator`): each turn's tool calls are run and their
    results come back as tool messages; a turn without a call ends the trajectory."""

    def __init__(self, tools: list[Callable[..., Any]]) -> None:
        self.tools = tools
        self._by_name = {tool.__name__: tool for tool in tools}
        self.calls = 0
        self.failed_calls = 0

    def reset(self, example: dict[str, Any]) -> str | None:
        self.calls = self.failed_calls = 0
        return None

    def step(self, completion: str) -> list[dict[str, Any]] | None:
        from grpo_cli.rollout.chat_turns import parse_tool_calls

        calls = parse_tool_calls(completion)
        if not calls:
            return None
        results = [call_tool(self._by_name, call) for call in calls]
        self.calls += len(calls)
        self.failed_calls += sum(message["content"].startswith("error: ") for message in results)
        return results

    def columns(self) -> dict[str, Any]:
        return {"env_tool_calls": self.calls, "env_tool_errors": self.failed_calls}


class TRLEnvironment(ToolEnvironment):
    """A class a TRL user passes as `GRPOTrainer(environment_factory=...)`, unchanged: built with no
    arguments, its public methods (but `reset` and `get_reward`) are the tools, `reset(**row)` may
    return text for the prompt (it is given the row's columns its signature accepts), and
    `get_reward()`, when it has one, is the environment's reward."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        tools = [
            getattr(obj, name)
            for name, _ in inspect.getmembers(type(obj), inspect.isfunction)
            if not name.startswith("_") and name not in TRL_RESERVED
        ]
        super().__init__(tools)

    def reset(self, example: dict[str, Any]) -> str | None:
        super().reset(example)
        reset = getattr(self.obj, "reset", None)
        if reset is None:
            return None
        parameters = inspect.signature(reset).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return reset(**example)
        return reset(**{k: v for k, v in example.items() if k in parameters})

    def reward(self) -> float | None:
        get_reward = getattr(self.obj, "get_reward", None)
        return None if get_reward is None else get_reward()
