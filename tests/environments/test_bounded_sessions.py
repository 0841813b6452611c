"""Issue 52 item 4: env=code_feedback keeps to `sandbox.workers` sandboxed sessions at once, as
code_tests does, through the episode generator train, rollout and eval sample with. Every row's
step() used to start at once (B x G sessions), so under load right answers timed out."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import EnvConfig, RolloutConfig, SandboxConfig
from grpo_cli.models import load_tokenizer
from grpo_cli.rewards.code.batch import sandbox_for
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length
from grpo_cli.training.pipeline import generate_groups

G = 3
# Each answer's session lasts 0.6 s at least (the prompt's code sleeps), so sessions started
# together overlap on any machine; the assert fails, so each session ran the tests.
PROMPT = "import time\ntime.sleep(0.6)\n\n\ndef same(x):\n    return x\n"
EXAMPLES = [{"prompt": PROMPT, "entry_point": "same", "test_list": [f"assert same({k}) == {k + 1}"]} for k in (1, 2)]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    """The tiny model, made to write only `#`: every answer compiles (a comment after the prompt's
    code) and so reaches the sandbox, whatever the random weights."""
    tokenizer = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    head.weight = model.get_input_embeddings().weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.convert_tokens_to_ids("#")] = 50.0
    model.lm_head = head
    return model, tokenizer


def test_code_feedback_runs_at_most_sandbox_workers_sessions_at_once(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    sandbox = SandboxConfig(workers=2, timeout_s=7.25)  # its own timeout: a sandbox no other test shares
    rollout = RolloutConfig(max_new_tokens=4)
    encoder = PromptEncoder(tokenizer, 64, torch.device("cpu"))
    generator, _ = make_generator(model, tokenizer, rollout)
    env = EnvConfig(name="code_feedback", max_turns=1)
    generator, _ = with_environment(generator, encoder, tokenizer, env, sandbox, rollout, context_length(model))
    result = generate_groups(EXAMPLES, encoder, generator, G)
    assert result.texts == ["####"] * len(EXAMPLES) * G
    assert result.env_columns["env_error"] == [None] * 6
    assert result.env_columns["env_turn_scores"] == [[0.0]] * 6  # each answer ran the tests in a session
    box = sandbox_for(**dataclasses.asdict(sandbox))
    assert 1 <= box.most_at_once <= box.workers <= sandbox.workers  # 6 before: every row's step at once
