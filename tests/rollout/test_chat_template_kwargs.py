"""data.chat_template_kwargs (TRL's chat_template_kwargs) reach every chat-template rendering a run
makes: the prompts of train, rollout and eval, and multi-turn's text between turns, so a later turn
opens as the first did. The template here reads `enable_thinking` as Qwen3's does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.schema import (
    DataConfig,
    EnvConfig,
    ModelConfig,
    RolloutConfig,
    SandboxConfig,
    TinyModelConfig,
    TrainConfig,
)
from grpo_cli.errors import GrpoError
from grpo_cli.models import build_tiny_model, load_tokenizer
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length, fit_prompts
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.pipeline import generate_groups, load_sampling_model

CPU = torch.device("cpu")
THINKING_TEMPLATE = (  # Qwen3's switch: thinks unless enable_thinking is false
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: "
    "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% else %}<think>{% endif %}{% endif %}"
)
NO_THINKING = {"enable_thinking": False}
QUESTION = [{"role": "user", "content": "2+3="}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved with the thinking template, as a hub model directory is."""
    directory = build_tiny_model(tmp_path_factory.mktemp("thinking") / "model", TinyModelConfig(), seed=0)
    tokenizer = load_tokenizer(directory)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def rendered(encoder: PromptEncoder, prompt: list[dict]) -> str:
    ids, mask = encoder([prompt])
    return encoder.tokenizer.decode(ids[0][mask[0].bool()])


def test_the_template_without_kwargs_thinks(model_dir: Path) -> None:
    """The control: the same template and prompt render the other branch when no kwarg is given."""
    assert rendered(PromptEncoder(load_tokenizer(model_dir), 64, CPU), QUESTION).endswith("assistant: <think>")


def test_the_trainers_and_the_samplers_prompts_carry_the_kwargs(model_dir: Path, tmp_path: Path) -> None:
    cfg = TrainConfig()
    cfg.model = ModelConfig(kind="hf", path=str(model_dir))
    cfg.data.chat, cfg.data.chat_template_kwargs = True, dict(NO_THINKING)
    trainer = GRPOTrainer(cfg, tmp_path / "train")
    trainer.setup()
    try:
        assert rendered(trainer.encoder, QUESTION).endswith("assistant: <no_think>")
    finally:
        trainer.cleanup()
    loaded = load_sampling_model(  # what grpo rollout and grpo eval sample with
        cfg.model,
        cfg.data,
        cfg.rollout,
        "eval",
        [{"prompt": QUESTION, "answer": "5"}],
        1,
        tmp_path / "rollout",
        0,
        CPU,
        "fp32",
        EnvConfig(),
        SandboxConfig(),
    )
    assert rendered(loaded.encoder, QUESTION).endswith("assistant: <no_think>")


def test_the_text_between_turns_opens_the_next_turn_with_the_kwargs(model_dir: Path) -> None:
    """Multi-turn: the model (biased to end each turn at once) answers EOS, the environment replies,
    and the template's opening of the next assistant turn follows, rendered with the kwargs."""
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    head.weight = model.get_input_embeddings().weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 50.0  # every model turn is its EOS alone
    model.lm_head = head
    rollout = RolloutConfig(max_new_tokens=4)
    encoder = PromptEncoder(tokenizer, 64, CPU, DataConfig(chat_template_kwargs=NO_THINKING).chat_template_kwargs)
    generator, _ = make_generator(model, tokenizer, rollout)
    env = EnvConfig(name="custom", target="tests.rollout.environments:EchoEnv", max_turns=2)
    generator, _ = with_environment(generator, encoder, tokenizer, env, SandboxConfig(), rollout, context_length(model))
    result = generate_groups([{"prompt": QUESTION, "answer": "5"}], encoder, generator, 1, greedy=True)
    environment = result.completion_ids[0][(result.sampled_mask[0] == 0) & (result.completion_mask[0] == 1)]
    assert tokenizer.decode(environment).endswith("user: try again 1\nassistant: <no_think>")


def test_an_argument_the_encoder_sets_is_refused() -> None:
    data = DataConfig(chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(GrpoError, match="data.chat_template_kwargs.add_generation_prompt=False: an argument the"):
        validate_generation(ModelConfig(), data, RolloutConfig())


def test_kwargs_no_prompt_would_use_are_refused(model_dir: Path) -> None:
    """Plain-text prompts never meet the template: the kwargs would do nothing, so they are refused."""
    encoder = PromptEncoder(load_tokenizer(model_dir), 64, CPU, NO_THINKING)
    with pytest.raises(GrpoError, match="no prompt goes through the chat template"):
        fit_prompts({"train": [{"prompt": "2+3="}]}, encoder, 64, 4, 256, "truncate_left")
    kept, _ = fit_prompts({"train": [{"prompt": QUESTION}]}, encoder, 64, 4, 256, "truncate_left")
    assert kept["train"] == [{"prompt": QUESTION}]
