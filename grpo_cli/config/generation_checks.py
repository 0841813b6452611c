"""The value checks of every command that samples from a model on a data set: train, rollout, and
eval when it generates.

Its own module because three commands share it: each command's module calls `validate_generation`
and adds its own checks.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from urllib.parse import urlsplit

from grpo_cli.config.checks import CHOICES, check_at_least_one, check_choice, fail
from grpo_cli.config.group_keys import check_group_keys
from grpo_cli.config.schema import DataConfig, ModelConfig, RolloutConfig
from grpo_cli.data.hf import check_hf_path
from grpo_cli.errors import GrpoError

# rollout.generation_kwargs keys (transformers' and vLLM's names) that a rollout.* key or the loop
# itself sets: given twice, one value would silently lose (TRL lets generation_kwargs win)
_EOS = "the model's EOS ids (a completion ends at an EOS token: the masks and the truncation flags read it)"
_LOOP = "the rollout loop (it reads the sampled ids, and vLLM's log-prob of each, itself)"
GENERATION_KWARGS_OWNED = {
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_tokens": "rollout.max_new_tokens",
    "max_length": "rollout.max_new_tokens",
    "min_new_tokens": "rollout.min_new_tokens",
    "min_tokens": "rollout.min_new_tokens",
    "min_length": "rollout.min_new_tokens",
    "num_return_sequences": "rollout.num_generations",
    "n": "rollout.num_generations",
    "do_sample": "the command (sampled groups; greedy for the greedy/* and eval/* answers)",
    "seed": "the run's seed (train.seed; seed= for grpo rollout and eval), which seeds every draw",
    "eos_token_id": _EOS,
    "stop_token_ids": _EOS,
    "ignore_eos": _EOS,
    "stop": _EOS,
    "stop_strings": _EOS,
    "pad_token_id": "the tokenizer's pad token",
    "logprobs": _LOOP,
    "detokenize": _LOOP,
    "return_dict_in_generate": _LOOP,
    "output_scores": _LOOP,
    "output_logits": _LOOP,
}
# apply_chat_template's own arguments, which the prompt encoder sets (env.* offers the tools)
VLLM_MODES = ("colocated", "server")  # rollout.vllm.mode
VLLM_TRANSFERS = ("auto", "file", "http")  # rollout.vllm.transfer
CHAT_TEMPLATE_OWNED = (
    "conversation",
    "tools",
    "tokenize",
    "add_generation_prompt",
    "continue_final_message",
    "return_dict",
    "return_tensors",
    "return_assistant_tokens_mask",
    "padding",
    "truncation",
    "max_length",
    "tokenizer_kwargs",
)


def validate_generation(model: ModelConfig, data: DataConfig, rollout: RolloutConfig) -> None:
    """The checks of every command that samples from a model on a data set (train, rollout)."""
    choices = {
        "model.kind": model.kind,
        "model.dtype": model.dtype,
        "data.kind": data.kind,
        "data.on_long_prompt": data.on_long_prompt,
        "rollout.backend": rollout.backend,
        "rollout.loop": rollout.loop,
        "rollout.sampling_weights": rollout.sampling_weights,
    }
    for key, value in choices.items():
        check_choice(key, value, CHOICES[key])
    check_group_keys("model", model)  # e.g. model.path under model=tiny: before the path itself is looked at
    check_group_keys("data", data)
    _check_sampling(rollout)
    _check_vllm_server(rollout)
    _check_engine_installed(rollout)
    check_generation_kwargs(rollout)
    _check_chat_template_kwargs(data)
    _check_fractions(data)
    _check_model(model)
    _check_data_file(data)


def _check_vllm_server(rollout: RolloutConfig) -> None:
    """rollout.vllm.mode and the server's keys, said before the model loads."""
    vllm = rollout.vllm
    check_choice("rollout.vllm.mode", vllm.mode, VLLM_MODES)
    check_choice("rollout.vllm.transfer", vllm.transfer, VLLM_TRANSFERS)
    for key, seconds in (("call_timeout", vllm.call_timeout), ("ready_timeout", vllm.ready_timeout)):
        if not seconds > 0:  # 0 would fail every call at once; an unbounded wait is what the key is there to stop
            fail(f"rollout.vllm.{key}", seconds, "must be > 0 (seconds)")
    if rollout.backend != "vllm" or vllm.mode != "server":
        return
    url = urlsplit(vllm.server_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        fail(
            "rollout.vllm.server_url",
            vllm.server_url,
            "rollout.vllm.mode=server needs the server's base URL, e.g. http://127.0.0.1:8000",
        )


def _check_engine_installed(rollout: RolloutConfig) -> None:
    """rollout.backend=vllm without a vLLM that runs here: said before the model loads (a real model
    takes a minute), not when the engine is built. A server (mode=server) runs vLLM elsewhere."""
    if rollout.backend != "vllm" or rollout.vllm.mode == "server":
        return
    from grpo_cli.rollout.vllm import vllm_unavailable  # torch and transformers: only for this backend

    reason = vllm_unavailable()
    if reason is not None:
        raise GrpoError(reason)


def _check_sampling(rollout: RolloutConfig) -> None:
    if rollout.max_new_tokens < 1:
        fail("rollout.max_new_tokens", rollout.max_new_tokens, "must be at least 1")
    if not 0 <= rollout.min_new_tokens <= rollout.max_new_tokens:
        fail(
            "rollout.min_new_tokens",
            rollout.min_new_tokens,
            f"must be in [0, rollout.max_new_tokens={rollout.max_new_tokens}]",
        )
    if rollout.temperature <= 0:
        fail("rollout.temperature", rollout.temperature, "must be > 0")
    if not 0 < rollout.top_p <= 1:
        fail("rollout.top_p", rollout.top_p, "must be in (0, 1]")
    if rollout.top_k < 0:
        fail("rollout.top_k", rollout.top_k, "must be >= 0 (0 disables top-k)")
    if rollout.min_p is not None and not 0 <= rollout.min_p <= 1:
        fail("rollout.min_p", rollout.min_p, "must be in [0, 1], or null (off)")
    if rollout.repetition_penalty <= 0:
        fail("rollout.repetition_penalty", rollout.repetition_penalty, "must be > 0 (1: off)")


def check_sampling_only(rollout: RolloutConfig) -> None:
    """`grpo rollout` and `grpo eval` share train's rollout section; what only training does is refused."""
    if rollout.max_staleness != 0:
        fail(
            "rollout.max_staleness",
            rollout.max_staleness,
            "is grpo train's (a sampler running ahead of the update): nothing trains here, leave it 0",
        )


def check_generation_kwargs(rollout: RolloutConfig) -> None:
    """Refuse a rollout.generation_kwargs key that a rollout.* key or the loop sets; every rollout
    loop calls it too, for a library caller who skipped validate()."""
    for key, value in rollout.generation_kwargs.items():
        if key in GENERATION_KWARGS_OWNED:
            owner = GENERATION_KWARGS_OWNED[key]
            fix = f"set {owner} instead" if owner.startswith("rollout.") else "leave it out"
            fail(f"rollout.generation_kwargs.{key}", value, f"set by {owner}: {fix}")


def _check_chat_template_kwargs(data: DataConfig) -> None:
    for key, value in data.chat_template_kwargs.items():
        if key in CHAT_TEMPLATE_OWNED:
            fail(f"data.chat_template_kwargs.{key}", value, "an argument the prompt encoder sets itself: leave it out")


def _check_fractions(data: DataConfig) -> None:
    if data.max_prompt_tokens < 1:  # 0 cut every prompt to nothing from the left, and training went on
        fail("data.max_prompt_tokens", data.max_prompt_tokens, "must be at least 1 (tokens of a prompt)")
    if not 0 < data.fraction <= 1:
        fail("data.fraction", data.fraction, "must be in (0, 1]")
    if not 0 <= data.eval_fraction < 1:
        fail("data.eval_fraction", data.eval_fraction, "must be in [0, 1)")


def _check_model(model: ModelConfig) -> None:
    if model.kind == "tiny":  # a size of 0 failed inside transformers (num_layers=0: an IndexError on first use)
        check_at_least_one({f"model.tiny.{f.name}": getattr(model.tiny, f.name) for f in fields(model.tiny)})
    if model.kind == "tiny" and model.tiny.hidden_size % model.tiny.num_heads:  # attention splits the width
        fail(
            "model.tiny.hidden_size",
            model.tiny.hidden_size,
            f"must be a multiple of model.tiny.num_heads={model.tiny.num_heads}",
        )
    if model.kind == "hf" and (model.path or not model.package):  # model.path wins over model.package
        if not model.path:
            raise GrpoError(
                "model=hf needs model.path=DIR (a local Hugging Face model directory, a .gguf file or a hub id)"
            )
        from grpo_cli.model_source import check_model_path  # torch and transformers: only when a model is named

        check_model_path(model.path)


def _check_data_file(data: DataConfig) -> None:
    if data.kind == "hf":
        check_hf_path(data.path)  # a hub id is looked up in the datasets cache when the data loads
    if data.kind == "jsonl":
        if not data.path:
            raise GrpoError("data=jsonl needs data.path=FILE")
        if Path(data.path).is_dir():
            raise GrpoError(f"data.path={data.path}: a directory; data=jsonl reads one file, a JSON object per line")
        if not Path(data.path).exists():
            raise GrpoError(f"data.path={data.path}: no such file")
        if not Path(data.path).is_file():  # /dev/null, a pipe, a socket: there, but nothing to read rows from
            raise GrpoError(
                f"data.path={data.path}: not a regular file (a device, a pipe or a socket); "
                "data=jsonl reads one file, a JSON object per line"
            )
