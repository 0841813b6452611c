"""env=agent's harness (environments/agent.py): loaded from a file or a module and checked at
start-up, run as a Python function or as a command once per episode, and every way it can fail
(raises, hangs past env.timeout_s, never calls the endpoint, a command that exits non-zero or
hangs) costs its episode only, with the trainer's alert naming the harness and the cause."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.env_checks import validate_env
from grpo_cli.config.schema import EnvConfig, RolloutConfig, SandboxConfig
from grpo_cli.environments import load_environment
from grpo_cli.environments.agent import load_harness, run_command
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_tokenizer
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length
from grpo_cli.training.metrics import environment_alert
from grpo_cli.training.pipeline import generate_groups

HERE = "tests.environments.test_agent_env"
EXAMPLES = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
# A command harness as a user writes one in any language: it reads its base URL, key and row from
# the environment, makes one request with plain HTTP, and prints its reward last
COMMAND_AGENT = """
import json, os, sys, urllib.request
row = json.loads(sys.stdin.read())
body = json.dumps({"messages": [{"role": "user", "content": row["prompt"]}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
reply = json.loads(urllib.request.urlopen(request).read())
print("log line")
print(len(reply["choices"][0]["message"]["content"]) + 0.5 if row["prompt"] == "1+1=" else "None")
"""


def one_request(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    from openai import OpenAI

    chat = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    chat.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0


def raises(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    if row["prompt"] == "1+1=":
        raise RuntimeError("the agent broke")
    return one_request(base_url, api_key, row)


def hangs(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    if row["prompt"] == "1+1=":
        one_request(base_url, api_key, row)
        time.sleep(120)  # past env.timeout_s: given up, its thread left behind
    return one_request(base_url, api_key, row)


def never_calls(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    return 1.0 if row["prompt"] == "1+1=" else one_request(base_url, api_key, row)


def returns_text(base_url: str, api_key: str, row: dict[str, Any]) -> str:
    one_request(base_url, api_key, row)
    return "good"


def two_arguments(base_url: str, api_key: str) -> None:
    return None


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), load_tokenizer(tiny_model_dir)


def rollout_of(policy, env: EnvConfig, examples=EXAMPLES, group: int = 1):
    model, tokenizer = policy
    rollout = RolloutConfig(max_new_tokens=4)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout)
    generator, _ = with_environment(generator, encoder, tokenizer, env, SandboxConfig(), rollout, context_length(model))
    return generate_groups(examples, encoder, generator, group)


@pytest.mark.parametrize(
    ("harness", "error", "timeout_s"),
    [
        ("raises", "agent tests.environments.test_agent_env:raises: raised RuntimeError: the agent broke", 30.0),
        ("hangs", "did not return within env.timeout_s=2s (its thread is left behind)", 2.0),
        ("never_calls", "returned without a request to the endpoint (was its client given the base_url", 30.0),
        ("returns_text", "raised TypeError: returned 'good': expected a number (the reward) or None", 30.0),
    ],
)
def test_a_failing_harness_costs_its_episode_with_an_alert_naming_it(policy, harness, error, timeout_s) -> None:
    started = time.perf_counter()
    env = EnvConfig(name="agent", agent=f"{HERE}:{harness}", timeout_s=timeout_s)
    rollout = rollout_of(policy, env)
    assert time.perf_counter() - started < timeout_s + 10  # a hang costs its deadline, not the rollout
    errors = rollout.env_columns["env_error"]
    assert error in errors[0]
    if harness != "returns_text":
        assert errors[1] is None and rollout.env_columns["env_reward"] == [None, 1.0]
    alert = environment_alert(rollout, env)
    assert (
        alert.startswith("the agent failed on ")
        and f"first: agent tests.environments.test_agent_env:{harness}: " in alert
    )


def test_a_command_runs_once_per_episode_with_the_endpoint_in_its_environment(policy, tmp_path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(COMMAND_AGENT)
    env = EnvConfig(name="agent", command=f"{sys.executable} {script}")
    rollout = rollout_of(policy, env)
    assert rollout.env_columns["env_error"] == [None, None]
    reply = rollout.messages[0][-1]["content"]
    assert rollout.env_columns["env_reward"] == [len(reply) + 0.5, None]  # its last line; "None": the functions'
    assert rollout.env_columns["env_turns"] == [1, 1]


def test_a_command_that_fails_or_hangs_costs_its_episode(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="exited with status 3: oops"):
        run_command("echo oops >&2; exit 3", "http://127.0.0.1:9/v1", "k", {}, 10.0)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match="killed at env.timeout_s=0.5s"):
        run_command("sleep 30 & sleep 30", "http://x", "k", {}, 0.5)  # the shell and its children
    assert time.perf_counter() - started < 5
    assert run_command("echo 0.25", "http://x", "k", {}, 10.0) == 0.25
    assert run_command("echo done", "http://x", "k", {}, 10.0) is None


def test_a_file_path_or_a_module_names_the_function_and_mistakes_fail_at_start_up(tmp_path) -> None:
    agent = tmp_path / "my_agent.py"
    agent.write_text("def run(base_url, api_key, row):\n    return 0.5\n")
    assert load_harness(EnvConfig(name="agent", agent=f"{agent}:run")).run("u", "k", {}, 1.0) == 0.5
    assert load_environment(EnvConfig(name="agent", agent=f"{HERE}:one_request"), SandboxConfig()).tools == []
    for env, words in (
        (EnvConfig(name="agent", agent=f"{tmp_path}/nope.py:run"), "no file"),
        (EnvConfig(name="agent", agent=f"{agent}:walk"), "has no function walk"),
        (EnvConfig(name="agent", agent=f"{HERE}:two_arguments"), "cannot be called as run(base_url, api_key, row)"),
        (EnvConfig(name="agent", agent="run"), "expected FILE.py:FUNCTION or module:function"),
        (EnvConfig(name="agent"), "set env.agent=FILE.py:FUNCTION"),
        (EnvConfig(name="agent", agent=f"{agent}:run", command="node agent.js"), "one of the two"),
    ):
        with pytest.raises(GrpoError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            validate_env(env)
            load_environment(env, SandboxConfig())
    assert Path(agent).is_file()


def test_a_rollout_cut_short_leaves_no_command_running(tmp_path) -> None:
    """A command runs in a session of its own (so its deadline can kill its process group), which keeps
    the terminal's Ctrl-C from it: the rollout's unwinding stops what is still running (Harness.stop)."""
    import threading

    marker = tmp_path / "started"
    harness = load_harness(EnvConfig(name="agent", command=f"touch {marker}; sleep 60"))
    outcome: list[BaseException] = []

    def episode() -> None:
        try:
            harness.run("http://127.0.0.1:9/v1", "key", {"prompt": "1+1="}, 120.0)
        except BaseException as err:  # noqa: BLE001 (what the episode thread records)
            outcome.append(err)

    thread = threading.Thread(target=episode)
    thread.start()
    deadline = time.monotonic() + 30
    while not (marker.exists() and harness.running) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    harness.stop()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - started < 10  # not the 60 s of its sleep
    assert "exited with status -9" in str(outcome[0]) and not harness.running
