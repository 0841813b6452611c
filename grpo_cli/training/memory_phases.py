"""The memory plan's sizes, phase by phase (training.memory_plan adds them up): what the worst
batch a config allows holds resident, in generation, in the update and in the passes without
gradient, each in bytes from the config and the model's shape (docs/architecture.md §3, "Memory plan").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from grpo_cli.config.schema import ModelConfig, TrainConfig
from grpo_cli.core.entropy import entropy_bonus_on
from grpo_cli.core.logprobs import CHUNK_ELEMENTS
from grpo_cli.core.packing import choose_layout
from grpo_cli.core.precision import PRECISION_DTYPES, effective_precision, weights_dtype
from grpo_cli.environments import trajectory_tokens
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.fast import settings_unsupported
from grpo_cli.rollout.sampling_copy import copy_decision
from grpo_cli.training.memory_report import Part
from grpo_cli.training.model_shape import ModelShape

# Activations a training pass saves for backward, in elements per token, measured on Llama models
# (hidden h 64-576, MLP i 128-1792, multi-head and grouped-query attention, padded and packed
# layouts) by summing the storages torch.autograd.graph.saved_tensors_hooks receives; per layer as
# the difference between a 2-layer and a 1-layer model, within 0.3% of these sums:
#   full fine-tuning:    6h + 4q + 4i        (q = heads x head dim: 10h + 4i when q = h)
#   LoRA (frozen base):  2h + 2q + 2kv + 3i  (a frozen Linear keeps no input; kv = KV heads x head dim),
#                        plus per adapter r (A's output) and, with lora.dropout > 0 (and
#                        model.disable_dropout=false, which sets it to 0), 2 x in_features
#                        (the dropped input and its mask), else h (the shared normed input):
#                        h=256: 5,184 for 5,190 measured; SmolLM2's shape: 11,968 for 11,979
#   the model's ends (embedding output, final norm, the lm_head's input): about 3h
FULL_LAYER = (6, 4, 0, 4)  # coefficients of (h, q, kv, i)
FROZEN_LAYER = (2, 2, 2, 3)
MODEL_ENDS = 3  # x h
# Sampling a token, per row and vocabulary entry: the float32 logits, the softmax and the float64
# CDF that rollout.fast.sample_categorical inverts.
SAMPLING_BYTES = 4 + 4 + 8


@dataclass(frozen=True)
class Pass:
    """One forward pass over a micro-batch: its rows, the groups they span, and its layout."""

    rows: int
    groups: int
    packed: bool
    tokens: int  # tokens the model computes
    row_length: int  # the longest input row


def micro_batches(rows: int, parts: int) -> Iterator[tuple[int, int]]:
    """(start, end) of `rows` split in `parts` as torch.tensor_split splits them (core.update)."""
    parts = max(1, min(parts, rows))
    per, extra = divmod(rows, parts)
    start = 0
    for k in range(parts):
        end = start + per + (k < extra)
        yield start, end
        start = end


def forward_pass(start: int, end: int, group_size: int, prompt: int, completion: int, layout: str, hidden: int) -> Pass:
    """Rows [start, end) of full-length rows, in the layout core.packing.choose_layout picks for them."""
    rows = end - start
    groups = torch.arange(start, end) // group_size
    full = torch.ones(rows, prompt + completion, dtype=torch.long)  # every prompt and completion at full length
    chosen = choose_layout(layout, full[:, :prompt], full[:, prompt:], groups, hidden)
    spanned = (end - 1) // group_size - start // group_size + 1
    if chosen == "packed":
        longest = prompt + min(group_size, rows) * completion
        return Pass(rows, spanned, True, spanned * prompt + rows * completion, longest)
    return Pass(rows, spanned, False, rows * (prompt + completion), prompt + completion)


@dataclass(frozen=True)
class Worst:
    """The batch the plan sizes for, per process, and what an element costs in each place."""

    weights_name: str  # the weights' dtype, as load_policy picks it
    wb: int  # bytes per element of the weights, and of generation (no autocast there)
    cb: int  # of the training passes
    tb: int  # of a trainable parameter and its AdamW moments
    lb: int  # of the logits
    trainable: int
    group_size: int
    prompt: int  # tokens: data.max_prompt_tokens clamped to the context
    completion: int
    prompts: int  # this process's
    layout: str

    @property
    def rows(self) -> int:
        return self.prompts * self.group_size

    def forward_pass(self, start: int, end: int, hidden: int) -> Pass:
        return forward_pass(start, end, self.group_size, self.prompt, self.completion, self.layout, hidden)


def worst_batch(cfg: TrainConfig, device: torch.device, shape: ModelShape) -> Worst:
    """The worst batch `cfg` allows on `device`, and an element's bytes in each place (the precision
    resolved as the trainer resolves it)."""
    precision, _ = effective_precision(cfg.precision, device)
    weights_name = weights_dtype(precision) if cfg.model.dtype == "auto" else cfg.model.dtype  # as load_policy
    wb = PRECISION_DTYPES[weights_name].itemsize
    cb = PRECISION_DTYPES[precision.dtype].itemsize if precision.autocast else wb
    lora = cfg.model.lora.enabled
    # peft keeps adapters in float32 (autocast_adapter_dtype); AdamW's moments take the parameter's dtype
    trainable, tb = (shape.lora_parameters(cfg.model.lora), 4) if lora else (shape.parameters, wb)
    lb = 4 if cfg.model.lm_head_fp32 else cb  # models.Float32Head: the logits in fp32 whatever the passes' dtype
    turn = cfg.rollout.max_new_tokens
    completion = trajectory_tokens(cfg.env, turn)  # a multi-turn completion: its turns and the environment's
    prompt = cfg.data.max_prompt_tokens  # clamped to the context as rollout.prompts.fit_prompts does
    if shape.context is not None:
        prompt = max(1, min(prompt, shape.context - turn))
        completion = min(completion, shape.context - prompt)  # the episode loop stops within the context
    prompts = max(1, cfg.train.prompts_per_step // cfg.distributed.num_processes)
    layout = cfg.train.layout if shape.packable else "padded"
    return Worst(
        weights_name, wb, cb, tb, lb, trainable, cfg.rollout.num_generations, prompt, completion, prompts, layout
    )


def shards(cfg: TrainConfig) -> int:
    """How many ways the trained state is split: the processes under distributed.strategy=fsdp, else 1."""
    processes = cfg.distributed.num_processes
    return processes if cfg.distributed.strategy == "fsdp" and processes > 1 else 1


def resident_parts(cfg: TrainConfig, shape: ModelShape, w: Worst) -> list[Part]:
    """What a run holds throughout: the weights, the KL reference, AdamW's moments; under fsdp also
    this process's shard of the trained copy (the whole weights stay, for sampling: training.sharding)."""
    n = shards(cfg)
    parts = [Part("weights", shape.parameters * w.wb, "resident", f"{shape.parameters / 1e6:.1f}M x {w.weights_name}")]
    if n > 1:
        how = f"1/{n} of the weights, distributed.strategy=fsdp"
        parts.append(Part("sharded weights", shape.parameters * w.wb // n, "resident", how))
    if cfg.algo.beta == 0:
        parts.append(Part("reference model", 0, "resident", "none at algo.beta=0"))
    elif cfg.model.lora.enabled:
        parts.append(Part("reference model", 0, "resident", "none extra: the base with adapters off"))
    else:
        parts.append(Part("reference model", shape.parameters * w.wb, "resident", "a frozen copy (algo.beta > 0)"))
    how = f"AdamW: 2 moments x {w.trainable / 1e6:.2f}M" + (f", 1/{n} of them" if n > 1 else "")
    parts.append(Part("optimizer state", 2 * w.trainable * w.tb // n, "resident", how))
    return parts


def generation_phase(cfg: TrainConfig, device: torch.device, shape: ModelShape, w: Worst, parts: list[Part]) -> int:
    """The generation phase's bytes, its part added to `parts`: every row's KV cache at full length,
    one layer's copy while DynamicCache grows it by concatenation, and every row's sampling buffers.
    vLLM keeps its cache in its own share, a resident part: on CUDA its share of the device; on a
    CPU a second copy of the weights (in the engine's processes) and its KV cache."""
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm.mode == "server":  # the engine lives on the server
        how = "the push's shared-memory file (/dev/shm); the engine and its cache are the server's"
        parts.append(Part("vLLM weights file", shape.parameters * w.wb, "resident", how))
        return 0
    if cfg.rollout.backend == "vllm":
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            engine = int(cfg.rollout.vllm.gpu_memory_utilization * total)
            parts.append(Part("vLLM engine", engine, "resident", "rollout.vllm.gpu_memory_utilization x the device"))
        else:
            engine = shape.parameters * w.wb + int(cfg.rollout.vllm.cpu_kv_cache_gib * 2**30)
            how = "a copy of the weights + rollout.vllm.cpu_kv_cache_gib, in the engine's processes"
            parts.append(Part("vLLM engine", engine, "resident", how))
        return 0
    # the fixed-shape decode (rollout.loop auto or fixed, plain decoders) keeps its cache in fp32 whatever
    # the weights: counted so for every family under those loops, an overestimate for the others in bf16
    kb = max(w.wb, 4) if cfg.rollout.loop in ("auto", "fixed") else w.wb
    pipelined = cfg.rollout.max_staleness > 0  # the sampler's thread: its own weights, sampling beside every phase
    if sampling_copy(cfg, device, shape, w):  # rollout.sampling_weights: resident
        parts.append(Part("bf16 sampling copy", shape.parameters * 2, "resident", "rollout.sampling_weights"))
    elif pipelined:
        how = "rollout.max_staleness: the sampler's own weights"
        parts.append(Part("sampler's copy", shape.parameters * w.wb, "resident", how))
    kv = w.rows * (w.prompt + w.completion) * shape.layers * 2 * shape.kv_dim * kb
    generation = kv + kv // shape.layers + w.rows * shape.vocab * SAMPLING_BYTES
    how = f"{w.rows} sequences x {w.prompt + w.completion} tokens"
    if pipelined:
        parts.append(Part("KV cache + sampling", generation, "resident", f"{how}, while the learner trains"))
        return 0
    parts.append(Part("KV cache + sampling", generation, "generation", how))
    return generation


def sampling_copy(cfg: TrainConfig, device: torch.device, shape: ModelShape, w: Worst) -> bool:
    """Whether the trainer will sample from a bf16 copy (rollout.engine.make_generator's rule; the
    loop assumed fast unless the settings force generate). A bf16 setting that cannot be honoured
    fails at start-up with its reason, not here."""
    rollout = cfg.rollout
    loop = "generate" if rollout.loop == "generate" or settings_unsupported(rollout) else "fast"
    try:
        return copy_decision(rollout.sampling_weights, loop, w.weights_name == "fp32", device, shape.parameters)[0]
    except GrpoError:
        return False


def _entropy(cfg: TrainConfig) -> bool:
    """core.update.Objective.needs_entropy: the single-pass update reports it; the loss may use it."""
    algo = cfg.algo
    return _single_pass(cfg) or entropy_bonus_on(algo) or algo.top_entropy_quantile < 1


def _single_pass(cfg: TrainConfig) -> bool:
    return cfg.algo.num_iterations == 1 and cfg.algo.mini_batches == 1


def update_phase(cfg: TrainConfig, shape: ModelShape, w: Worst, parts: list[Part]) -> int:
    """The update phase's bytes, its parts added to `parts`: the largest micro-batch of the largest
    mini-batch (core.update: mini-batches of whole groups, each split in train.grad_accum_steps
    micro-batches), its activations and logits, then the gradients."""
    mini_rows = math.ceil(w.prompts / cfg.algo.mini_batches) * w.group_size
    worst = max(
        (
            w.forward_pass(start, end, shape.hidden)
            for start, end in micro_batches(mini_rows, cfg.train.grad_accum_steps)
        ),
        key=lambda p: p.tokens,
    )
    lora = cfg.model.lora.enabled
    activations = _activations(worst, shape, cfg, w.cb, w.wb)
    entropy_grad = entropy_bonus_on(cfg.algo)
    logits = max(_logits(worst, w.completion, shape.vocab, w.lb, _entropy(cfg), entropy_grad=entropy_grad))
    gradients = w.trainable * w.tb // shards(cfg)  # fsdp: reduce-scattered into this process's shard
    # backward writes the output layer's gradient first; accumulation keeps the earlier micro-batches'
    held = gradients if cfg.train.grad_accum_steps > 1 else (0 if lora else shape.output_parameters * w.tb)
    checkpointed = ", checkpointed" if cfg.model.gradient_checkpointing else ""
    parts.append(Part("activations", activations, "update", f"{_describe(worst)}{checkpointed}"))
    parts.append(Part("logits", logits, "update", f"x {shape.vocab} vocabulary; fp32 in chunks"))
    parts.append(Part("gradients", gradients, "update", "the adapters" if lora else "every parameter"))
    return max(activations + logits + held, gradients)


def nograd_phase(cfg: TrainConfig, shape: ModelShape, w: Worst) -> Part | None:
    """Passes without gradient, ceil(rows / grad_accum_steps) rows each: the reference's log-probs
    (beta > 0) and the behaviour policy's (more than one update per rollout); None when neither runs."""
    if not (cfg.algo.beta > 0 or cfg.algo.num_iterations > 1 or cfg.algo.mini_batches > 1):
        return None
    micro = math.ceil(w.rows / cfg.train.grad_accum_steps)
    nograd = w.forward_pass(0, micro, shape.hidden)
    layer = _layer_elements(shape, cfg.model, frozen=True) * nograd.tokens * w.cb  # one layer at a time
    total = _logits(nograd, w.completion, shape.vocab, w.lb, entropy=not _single_pass(cfg))[0] + layer
    return Part("log-prob passes", total, "no-grad passes", _describe(nograd))


def _layer_elements(shape: ModelShape, model: ModelConfig, frozen: bool) -> int:
    """Elements one layer saves for backward per token (the measured coefficients above)."""
    lora = model.lora
    ch, cq, ckv, ci = FROZEN_LAYER if frozen else FULL_LAYER
    n = ch * shape.hidden + cq * shape.q_dim + ckv * shape.kv_dim + ci * shape.intermediate
    if frozen and lora.enabled:
        adapters = [m for m in shape.lora_targets(lora) if ".layers." in m[0]]
        per_layer = len(adapters) / shape.layers
        inputs = sum(fan_in for _, fan_in, _ in adapters) / shape.layers
        dropped = lora.dropout > 0 and not model.disable_dropout  # p = 0 hands the input itself on
        n += int(per_layer * lora.r + (2 * inputs if dropped else shape.hidden))
    return n


def _activations(p: Pass, shape: ModelShape, cfg: TrainConfig, cb: int, wb: int) -> int:
    """Saved activations of one training pass, and its attention mask. Checkpointed, each layer
    keeps its input and backward recomputes one layer at a time."""
    layer = _layer_elements(shape, cfg.model, frozen=cfg.model.lora.enabled)
    ends = MODEL_ENDS * shape.hidden
    if cfg.model.gradient_checkpointing:
        elements = p.tokens * (shape.layers * shape.hidden + layer + ends)
    else:
        elements = p.tokens * (shape.layers * layer + ends)
    # packed: an additive [k, 1, T, T] mask in the weights' dtype and the boolean ones it is made
    # from; padded: transformers' boolean [m, 1, T, T] causal mask
    mask = p.groups * p.row_length**2 * (wb + 2) if p.packed else p.rows * p.row_length**2
    return elements * cb + mask


def _logits(
    p: Pass, completion: int, vocab: int, cb: int, entropy: bool, entropy_grad: bool = False
) -> tuple[int, int]:
    """(forward, backward) bytes of a loss pass's logits (core.logprobs): the model's logits (packed:
    every position, then the completions' gathered), float32 chunks of at most CHUNK_ELEMENTS (three
    with the entropy: the scaled logits, the softmax and their product); backward adds the gradient
    of the gathered logits and its chunks (three when the entropy has a gradient), and packed the
    full rows' gradient it scatters into, once the chunks are gone."""
    if p.packed:
        full, picked = p.tokens * vocab * cb, p.rows * completion * vocab * cb
    else:
        full, picked = 0, p.rows * (completion + 1) * vocab * cb
    chunk = min(CHUNK_ELEMENTS, picked // cb) * 4
    forward = full + picked + (3 if entropy else 1) * chunk
    return forward, 2 * picked + max((3 if entropy_grad else 1) * chunk, full)


def _describe(p: Pass) -> str:
    layout = f"packed in {p.groups} rows" if p.packed else "padded"
    return f"{p.rows} sequences, {p.tokens} tokens ({layout})"
