"""env=agent's harness: the agent a user already wrote, run once per episode against the policy's
endpoint (`rollout/agent_endpoint.py`).

Two forms. A Python function, `env.agent=FILE.py:FUNCTION` or `module:function`, called as
`run(base_url, api_key, row)` on a thread of its own; it returns the episode's reward (a number) or
None (the reward functions decide, from the transcript). A command, `env.command='...'`, for agents
that are not Python: run through the shell once per episode with `OPENAI_BASE_URL` and
`OPENAI_API_KEY` in its environment (the variables the OpenAI SDKs read) and the row as JSON in
`GRPO_AGENT_ROW` and on its standard input; the last line it prints, when a number, is the reward.

Either way the episode has `env.timeout_s` from its start. A function past it is given up and its
thread left behind (Python cannot stop a thread); a command past it is killed, its process group
with it.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo_cli.config.schema import EnvConfig
from grpo_cli.errors import GrpoError

STDERR_TAIL = 400  # characters of a failed command's stderr kept in env_error


@dataclass
class Harness:
    """One form of the user's agent, as the episode loop calls it: `run(base_url, api_key, row,
    timeout_s)` returns the reward (float or None) or raises."""

    name: str  # env.agent or the command, for env_error and the start-up line
    run: Callable[[str, str, dict[str, Any], float], float | None]
    killed_on_timeout: bool  # a command is killed at its deadline; a function's thread is left behind
    running: set[subprocess.Popen] = field(default_factory=set)  # a command's live processes

    def stop(self) -> None:
        """Kill the commands still running, with their process groups: a rollout that ends early
        (Ctrl-C, an error) leaves no agent behind. Their own sessions keep them from the terminal's
        SIGINT, so nothing else would."""
        for process in list(self.running):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended since
                pass


def load_harness(env: EnvConfig) -> Harness:
    """The harness `env.agent` or `env.command` names, checked now (the file imports, the function
    takes three arguments), so a typo fails at start-up in one line, not on every episode."""
    if env.command is not None:
        command, running = env.command, set()
        return Harness(
            f"command {command!r}",
            lambda url, key, row, timeout: run_command(command, url, key, row, timeout, running),
            True,
            running,
        )
    target = str(env.agent)
    function = _function(target)
    try:
        inspect.signature(function).bind("base_url", "api_key", {})
    except TypeError as err:
        raise GrpoError(f"env.agent={target!r}: cannot be called as run(base_url, api_key, row): {err}") from None
    except ValueError:  # no signature to read (written in C): calling it will say
        pass
    return Harness(target, lambda url, key, row, timeout: reward_value(function(url, key, row)), False)


def _function(target: str) -> Callable[..., Any]:
    """`FILE.py:FUNCTION` (a path, relative to the working directory) or `module:function`."""
    from grpo_cli.rewards.sources import import_module_here

    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise GrpoError(f"env.agent={target!r}: expected FILE.py:FUNCTION or module:function")
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser()
            if not path.is_file():
                raise GrpoError(f"env.agent={target!r}: no file {path.resolve()}")
            module = _file_module(path.resolve())
        else:
            module = import_module_here(where)
    except GrpoError:
        raise
    except ImportError as err:
        raise GrpoError(f"env.agent={target!r}: cannot import {where}: {err}") from None
    except Exception as err:  # the user's module raised as it ran
        raise GrpoError(f"env.agent={target!r}: importing it raised {type(err).__name__}: {err}") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise GrpoError(f"env.agent={target!r}: {where} has no function {attr}")
    return function


def _file_module(path: Path) -> ModuleType:
    """The module of a harness file, run once per process: start-up's check and the rollout's
    generator both load it, and the user's module-level code (a client, a cache) should run once."""
    name = f"grpo_agent_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses and pickles find their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def reward_value(value: Any) -> float | None:
    """What a harness returned as the episode's reward: a number or None; anything else is its mistake."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        raise TypeError(f"returned {value!r}: expected a number (the reward) or None")
    return float(value)


def run_command(
    command: str,
    base_url: str,
    api_key: str,
    row: dict[str, Any],
    timeout_s: float,
    running: set[subprocess.Popen] | None = None,
) -> float | None:
    """One episode of a command harness (module docstring); killed with its process group at
    `timeout_s`. `running` holds it while it runs (Harness.stop)."""
    row_json = json.dumps(row, default=str)
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "GRPO_AGENT_ROW": row_json}
    process = subprocess.Popen(
        command,
        shell=True,  # the user's command line as they would type it: pipes, variables, an interpreter
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, so the deadline ends what it started too
    )
    running = set() if running is None else running
    running.add(process)
    try:
        out, err = process.communicate(row_json, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimeoutError(f"killed at env.timeout_s={timeout_s:g}s") from None
    finally:
        running.discard(process)
    if process.returncode != 0:
        raise RuntimeError(f"exited with status {process.returncode}: {err.strip()[-STDERR_TAIL:]}")
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last.lower() in ("", "none", "null"):
        return None
    try:
        return float(last)
    except ValueError:
        return None  # a command that prints its own log and no reward: the reward functions decide
