"""The memory plan (`grpo train plan=true`): a run's expected peak memory, part by part, from the
config and the model's config.json alone, before any weight loads (docs/architecture.md §3, "Memory plan").

A run holds resident parts (the weights, the KL reference, AdamW's moments) and goes through
phases that never overlap, because each frees what it used before the next starts: generation (the
KV cache and the sampling buffers), the passes without gradient (the reference's and the behaviour
policy's log-probs) and the update (one micro-batch's activations and logits, then the gradients).
The peak is the resident parts plus the largest phase, plus on a CPU what the allocator and torch's
runtime hold beyond live tensors. Sizes are the worst case a batch can reach: every prompt
`data.max_prompt_tokens` long (clamped to the context) and every completion `rollout.max_new_tokens`.

The plan is per process: with data parallelism each process holds its share of the prompts.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from grpo_cli.config.schema import LoraConfig, ModelConfig, PrecisionConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.core.logprobs import CHUNK_ELEMENTS, PACKABLE_ATTENTION
from grpo_cli.core.packing import choose_layout
from grpo_cli.core.precision import PRECISION_DTYPES, effective_precision, weights_dtype
from grpo_cli.errors import GrpoError
from grpo_cli.model_source import model_directory
from grpo_cli.models import adapter_base, is_adapter_dir, pick_device, tiny_model_config
from grpo_cli.monitor.console import console_mode

log = logging.getLogger("grpo")
GIB, MIB = 2**30, 2**20

# Activations a training pass saves for backward, in elements per token, measured on Llama models
# (hidden h 64-576, MLP i 128-1792, multi-head and grouped-query attention, padded and packed
# layouts) by summing the storages torch.autograd.graph.saved_tensors_hooks receives; per layer as
# the difference between a 2-layer and a 1-layer model, within 0.3% of these sums:
#   full fine-tuning:    6h + 4q + 4i        (q = heads x head dim: 10h + 4i when q = h)
#   LoRA (frozen base):  2h + 2q + 2kv + 3i  (a frozen Linear keeps no input; kv = KV heads x head dim),
#                        plus per adapter r (A's output) and, with lora.dropout > 0, 2 x in_features
#                        (the dropped input and its mask), else h (the shared normed input):
#                        h=256: 5,184 for 5,190 measured; SmolLM2's shape: 11,968 for 11,979
#   the model's ends (embedding output, final norm, the lm_head's input): about 3h
FULL_LAYER = (6, 4, 0, 4)  # coefficients of (h, q, kv, i)
FROZEN_LAYER = (2, 2, 2, 3)
MODEL_ENDS = 3  # x h
# Sampling a token, per row and vocabulary entry: the float32 logits, the softmax and the float64
# CDF that rollout.fast.sample_categorical inverts.
SAMPLING_BYTES = 4 + 4 + 8
# On a CPU the resident set a run adds exceeds its live tensors. CPU_SLACK: glibc keeps freed blocks
# under its mmap threshold (which grows to 32 MiB: most activation tensors) in per-thread heaps,
# fragmented. benchmarks/memory_plan.py measured it as each default run's peak over the same run with
# MALLOC_MMAP_THRESHOLD_=65536 (every freed block returned: the live peak), over the plan's largest
# phase: tiny30m 0.36-0.51 full and 0.27-0.70 LoRA, SmolLM2 0.20-0.22 full and 0.34 LoRA at dc62f3c
# (0.39-0.41, 0.45-0.77, 0.18-0.24 and 0.33-0.36 in the series before), varying from run to run with
# two threads (README "Memory plan"). 0.5 balances the worst: tiny30m LoRA planned at 0.82-0.88 of
# its highest measured peaks, SmolLM2 full at 1.15. CPU_RUNTIME: what the tiny default adds while its
# tensors are a few MiB (torch's thread pools, kernel scratch, autograd and rollout bookkeeping):
# 28-32 MiB above the plan's tensors with live memory, 54-67 MiB in all by default.
# Neither applies on CUDA, where nothing was measured (no GPU in that session): the plan there is its
# tensors against torch.cuda.mem_get_info, and the caching allocator's reserve is not planned.
CPU_SLACK = 0.5
CPU_RUNTIME = 32 * MIB
KNOBS_SHOWN = 4


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model, read from its config (built on the meta device: no memory)."""

    parameters: int
    layers: int
    hidden: int
    intermediate: int
    q_dim: int  # attention heads x head dim
    kv_dim: int  # KV heads x head dim
    vocab: int
    context: int | None
    output_parameters: int  # the output layer's (tied or not): the first gradient backward writes
    linears: tuple[tuple[str, int, int], ...]  # every Linear: (name, in, out), where LoRA's adapters go
    packable: bool  # its attention takes the packed layout's 4-D mask (core.logprobs.PACKABLE_ATTENTION)

    def lora_targets(self, lora: LoraConfig) -> list[tuple[str, int, int]]:
        """The Linears peft adapts: named like a target, or ending in `.target`."""
        targets = list(lora.target_modules)
        return [m for m in self.linears if any(m[0] == t or m[0].endswith(f".{t}") for t in targets)]

    def lora_parameters(self, lora: LoraConfig) -> int:
        """r x (in + out) per adapted Linear: A is r x in, B is out x r."""
        return sum(lora.r * (fan_in + fan_out) for _, fan_in, fan_out in self.lora_targets(lora))


def model_config(model: ModelConfig) -> PretrainedConfig:
    """The config the loader builds the model from, without its weights: the tiny model's from
    `model.tiny.*` (as models.build_tiny_model writes it), else a directory's config.json (a LoRA
    checkpoint's base; a GGUF file's converted copy, converted the first time as the loader would)."""
    if model.kind == "tiny" and not (model.path and (Path(model.path) / "config.json").is_file()):
        return tiny_model_config(model.tiny)
    path = Path(model.path) if model.kind == "tiny" else model_directory(model)
    if is_adapter_dir(path):
        path = adapter_base(path)
    if not (path / "config.json").is_file():
        raise GrpoError(f"model.path={path}: no config.json, not a Hugging Face model directory")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as err:
        raise GrpoError(f"model.path={path}: cannot read its config.json: {err}") from err


def model_shape(config: PretrainedConfig, trust_remote_code: bool = False) -> ModelShape:
    """Parameter counts from the model built on the meta device (exact for any architecture, tied
    weights once), sizes from the config under Llama's names (transformers maps most others')."""
    try:
        hidden, heads, layers = int(config.hidden_size), int(config.num_attention_heads), int(config.num_hidden_layers)
    except (AttributeError, TypeError) as err:
        raise GrpoError(f"memory plan: the model's config has no transformer sizes ({err})") from err
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, ImportError, OSError, TypeError) as err:  # e.g. a model type this transformers lacks
        raise GrpoError(f"memory plan: cannot build the model from its config: {err}") from err
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    context = getattr(config, "max_position_embeddings", None)
    output = model.get_output_embeddings()
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=layers,
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        q_dim=heads * head_dim,
        kv_dim=int(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
        vocab=int(config.vocab_size),
        context=int(context) if isinstance(context, int) and context > 0 else None,
        output_parameters=sum(p.numel() for p in output.parameters()) if output is not None else 0,
        linears=tuple(
            (name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
        ),
        packable=(getattr(config, "_attn_implementation", None) or "sdpa") in PACKABLE_ATTENTION,
    )


@dataclass
class Part:
    """One line of the plan: a size, and when it is held (resident, a phase, or the allocator's)."""

    name: str
    bytes: int
    when: str  # resident | generation | no-grad passes | update | allocator
    how: str = ""


@dataclass
class MemoryPlan:
    """The parts, each phase's total, the expected peak, and the memory free where it runs."""

    parts: list[Part]
    phases: dict[str, int]
    peak: int
    device: str
    free: int | None  # None: unknown on this platform
    sharing: int = 1  # processes that share this free memory (data parallelism on one CPU)
    knobs: list[tuple[str, int]] = field(default_factory=list)  # (override, peak with it) when it does not fit

    @property
    def fits(self) -> bool:
        return self.free is None or self.peak * self.sharing <= self.free

    @property
    def largest_phase(self) -> str:
        return max(self.phases, key=lambda name: self.phases[name])

    @property
    def biggest(self) -> Part:
        """The biggest part that counts towards the peak: a resident one or one of the largest phase's."""
        return max((p for p in self.parts if p.when in ("resident", self.largest_phase)), key=lambda p: p.bytes)

    def summary(self) -> str:
        return (
            f"memory plan: expected peak {size(self.peak)} per process on {self.device} ({self._free()}); "
            f"biggest part: {self.biggest.name} {size(self.biggest.bytes)}; grpo train ... plan=true shows every part"
        )

    def warning(self) -> str | None:
        """When it does not fit: the biggest part and the single overrides that would bring it down."""
        if self.fits:
            return None
        knobs = ", ".join(f"{override} (peak {size(peak)})" for override, peak in self.knobs[:KNOBS_SHOWN])
        return (
            f"memory plan: the expected peak {size(self.peak)}{self._times()} does not fit the {size(self.free)} "
            f"available on {self.device}; the biggest part is {self.biggest.name} ({size(self.biggest.bytes)}). "
            + (f"Overrides that lower it: {knobs}" if knobs else "No single override lowers it much.")
        )

    def caption(self) -> str:
        phases = ", ".join(f"{name} {size(total)}" for name, total in self.phases.items())
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"expected peak {size(self.peak)}{self._times()} = resident parts + the largest phase ({phases})"
            + (" + the CPU allocator's" if any(p.when == "allocator" for p in self.parts) else "")
            + f"; {self._free()}: {verdict}"
        )

    def _free(self) -> str:
        return f"{size(self.free)} available" if self.free is not None else "free memory unknown"

    def _times(self) -> str:
        return f" x {self.sharing} processes" if self.sharing > 1 else ""


def size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.1f} MiB"


def free_memory(device: torch.device) -> int | None:
    """Bytes a run can still take: CUDA's free memory on the device; on a CPU the system's available
    memory (Linux MemAvailable: free plus reclaimable caches; POSIX's available pages elsewhere)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # macOS has no SC_AVPHYS_PAGES
        return None


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


def plan_memory(
    cfg: TrainConfig, device: torch.device, free: int | None, shape: ModelShape | None = None
) -> MemoryPlan:
    """The plan of `cfg` on `device` against `free` bytes (None: unknown); when it does not fit,
    also the single overrides that lower it. `shape`: the config's model unless given."""
    if shape is None:
        shape = model_shape(model_config(cfg.model), cfg.model.trust_remote_code)
    plan = _plan(cfg, device, free, shape)
    if not plan.fits:
        plan.knobs = _knobs(cfg, device, free, shape, plan.peak)
    return plan


def _plan(cfg: TrainConfig, device: torch.device, free: int | None, shape: ModelShape) -> MemoryPlan:
    precision, _ = effective_precision(cfg.precision, device)
    weights_name = weights_dtype(precision) if cfg.model.dtype == "auto" else cfg.model.dtype  # as load_policy
    wb = PRECISION_DTYPES[weights_name].itemsize  # the weights, and generation (no autocast there)
    cb = PRECISION_DTYPES[precision.dtype].itemsize if precision.autocast else wb  # the training passes
    lora = cfg.model.lora.enabled
    # peft keeps adapters in float32 (autocast_adapter_dtype); AdamW's moments take the parameter's dtype
    trainable, tb = (shape.lora_parameters(cfg.model.lora), 4) if lora else (shape.parameters, wb)
    g, completion = cfg.rollout.num_generations, cfg.rollout.max_new_tokens
    prompt = cfg.data.max_prompt_tokens  # clamped to the context as rollout.prompts.fit_prompts does
    if shape.context is not None:
        prompt = max(1, min(prompt, shape.context - completion))
    processes = cfg.distributed.num_processes
    prompts = max(1, cfg.train.prompts_per_step // processes)
    rows = prompts * g
    layout = cfg.train.layout if shape.packable else "padded"

    parts = [Part("weights", shape.parameters * wb, "resident", f"{shape.parameters / 1e6:.1f}M x {weights_name}")]
    if cfg.algo.beta == 0:
        parts.append(Part("reference model", 0, "resident", "none at algo.beta=0"))
    elif lora:
        parts.append(Part("reference model", 0, "resident", "none extra: the base with adapters off"))
    else:
        parts.append(Part("reference model", shape.parameters * wb, "resident", "a frozen copy (algo.beta > 0)"))
    parts.append(Part("optimizer state", 2 * trainable * tb, "resident", f"AdamW: 2 moments x {trainable / 1e6:.2f}M"))

    # Generation: every row's KV cache at full length, one layer's copy while DynamicCache grows it
    # by concatenation, and every row's sampling buffers. vLLM keeps its cache in its own share.
    if cfg.rollout.backend == "vllm":
        generation = 0
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            engine = int(cfg.rollout.vllm.gpu_memory_utilization * total)
            parts.append(Part("vLLM engine", engine, "resident", "rollout.vllm.gpu_memory_utilization x the device"))
    else:
        kv = rows * (prompt + completion) * shape.layers * 2 * shape.kv_dim * wb
        generation = kv + kv // shape.layers + rows * shape.vocab * SAMPLING_BYTES
        how = f"{rows} sequences x {prompt + completion} tokens"
        parts.append(Part("KV cache + sampling", generation, "generation", how))

    # The update: the largest micro-batch of the largest mini-batch (core.update: mini-batches of
    # whole groups, each split in train.grad_accum_steps micro-batches).
    mini_rows = math.ceil(prompts / cfg.algo.mini_batches) * g
    worst = max(
        (
            forward_pass(start, end, g, prompt, completion, layout, shape.hidden)
            for start, end in micro_batches(mini_rows, cfg.train.grad_accum_steps)
        ),
        key=lambda p: p.tokens,
    )
    activations = _activations(worst, shape, cfg, cb, wb)
    algo = cfg.algo
    single_pass = algo.num_iterations == 1 and algo.mini_batches == 1
    # core.update.Objective.needs_entropy: the single-pass update reports it; the loss may use it
    entropy = single_pass or algo.entropy_coef > 0 or algo.top_entropy_quantile < 1
    lb = 4 if cfg.model.lm_head_fp32 else cb  # models.Float32Head: the logits in fp32 whatever the passes' dtype
    logits = max(_logits(worst, completion, shape.vocab, lb, entropy, entropy_grad=algo.entropy_coef > 0))
    gradients = trainable * tb
    # backward writes the output layer's gradient first; accumulation keeps the earlier micro-batches'
    held = gradients if cfg.train.grad_accum_steps > 1 else (0 if lora else shape.output_parameters * tb)
    update = max(activations + logits + held, gradients)
    checkpointed = ", checkpointed" if cfg.model.gradient_checkpointing else ""
    parts.append(Part("activations", activations, "update", f"{_describe(worst)}{checkpointed}"))
    parts.append(Part("logits", logits, "update", f"x {shape.vocab} vocabulary; fp32 in chunks"))
    parts.append(Part("gradients", gradients, "update", "the adapters" if lora else "every parameter"))
    phases = {"generation": generation, "update": update}

    # Passes without gradient, ceil(rows / grad_accum_steps) rows each: the reference's log-probs
    # (beta > 0) and the behaviour policy's (more than one update per rollout).
    if cfg.algo.beta > 0 or cfg.algo.num_iterations > 1 or cfg.algo.mini_batches > 1:
        micro = math.ceil(rows / cfg.train.grad_accum_steps)
        nograd = forward_pass(0, micro, g, prompt, completion, layout, shape.hidden)
        layer = _layer_elements(shape, cfg.model.lora, frozen=True) * nograd.tokens * cb  # one layer at a time
        phases["no-grad passes"] = _logits(nograd, completion, shape.vocab, lb, entropy=not single_pass)[0] + layer
        parts.append(Part("log-prob passes", phases["no-grad passes"], "no-grad passes", _describe(nograd)))

    peak = sum(p.bytes for p in parts if p.when == "resident") + max(phases.values())
    if device.type == "cpu":
        slack = int(CPU_SLACK * max(phases.values())) + CPU_RUNTIME
        how = f"{CPU_SLACK:g} x the largest phase + {size(CPU_RUNTIME)}"
        parts.append(Part("CPU allocator + runtime", slack, "allocator", how))
        peak += slack
    return MemoryPlan(parts, phases, peak, str(device), free, processes if device.type == "cpu" else 1)


def _layer_elements(shape: ModelShape, lora: LoraConfig, frozen: bool) -> int:
    """Elements one layer saves for backward per token (the measured coefficients above)."""
    ch, cq, ckv, ci = FROZEN_LAYER if frozen else FULL_LAYER
    n = ch * shape.hidden + cq * shape.q_dim + ckv * shape.kv_dim + ci * shape.intermediate
    if frozen and lora.enabled:
        adapters = [m for m in shape.lora_targets(lora) if ".layers." in m[0]]
        per_layer = len(adapters) / shape.layers
        inputs = sum(fan_in for _, fan_in, _ in adapters) / shape.layers
        n += int(per_layer * lora.r + (2 * inputs if lora.dropout > 0 else shape.hidden))
    return n


def _activations(p: Pass, shape: ModelShape, cfg: TrainConfig, cb: int, wb: int) -> int:
    """Saved activations of one training pass, and its attention mask. Checkpointed, each layer
    keeps its input and backward recomputes one layer at a time."""
    layer = _layer_elements(shape, cfg.model.lora, frozen=cfg.model.lora.enabled)
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


def _knobs(
    cfg: TrainConfig, device: torch.device, free: int | None, shape: ModelShape, peak: int
) -> list[tuple[str, int]]:
    """Overrides that lower the peak by 3% or more, each with the peak it gives: first those that
    leave the training unchanged (grad_accum_steps, checkpointing, autocast), then those that change
    it; when none fits alone, the unchanged-training ones together lead."""
    keep: list[tuple[str, Callable[[TrainConfig], None]]] = []
    accum = cfg.train.grad_accum_steps * 4
    keep.append((f"train.grad_accum_steps={accum}", lambda c: setattr(c.train, "grad_accum_steps", accum)))
    if not cfg.model.gradient_checkpointing:
        keep.append(("model.gradient_checkpointing=true", lambda c: setattr(c.model, "gradient_checkpointing", True)))
    if cfg.precision.dtype == "fp32":
        bf16 = PrecisionConfig(dtype="bf16", autocast=True, grad_scaler=False)  # conf/precision/bf16.yaml
        keep.append(("precision=bf16", lambda c: setattr(c, "precision", bf16)))
    change: list[tuple[str, Callable[[TrainConfig], None]]] = []
    if not cfg.model.lora.enabled:
        change.append(("model.lora.enabled=true", lambda c: setattr(c.model.lora, "enabled", True)))
    if cfg.algo.beta > 0:
        change.append(("algo.beta=0", lambda c: setattr(c.algo, "beta", 0.0)))
    if cfg.rollout.num_generations >= 4:
        half = cfg.rollout.num_generations // 2
        change.append((f"rollout.num_generations={half}", lambda c: setattr(c.rollout, "num_generations", half)))
    if cfg.rollout.max_new_tokens >= 2:
        tokens = cfg.rollout.max_new_tokens // 2
        change.append((f"rollout.max_new_tokens={tokens}", lambda c: setattr(c.rollout, "max_new_tokens", tokens)))

    def peak_with(*changes: Callable[[TrainConfig], None]) -> int:
        trial = copy.deepcopy(cfg)
        for apply in changes:
            apply(trial)
        return _plan(trial, device, None, shape).peak

    knobs = [(override, peak_with(apply)) for override, apply in keep + change]
    knobs = [(override, lowered) for override, lowered in knobs if lowered < 0.97 * peak]
    if free is not None and len(keep) > 1 and all(lowered > free for _, lowered in knobs):
        together = peak_with(*(apply for _, apply in keep))
        knobs.insert(0, (" ".join(override for override, _ in keep), together))
    return knobs


def plan_table(plan: MemoryPlan) -> Table:
    """The plan as a rich table: each part, when it is held, and the peak against the free memory."""
    table = Table(title=f"grpo train: memory plan (per process, {plan.device})", header_style="bold")
    for column, justify in (("part", "left"), ("size", "right"), ("when", "left"), ("how", "left")):
        table.add_column(column, justify=justify)
    for part in plan.parts:
        table.add_row(part.name, size(part.bytes) if part.bytes else "-", part.when, part.how)
    table.caption = plan.caption()
    return table


def plan_lines(plan: MemoryPlan) -> list[str]:
    """The plan as plain lines (CI logs, files): what the table says."""
    lines = [f"grpo train: memory plan (per process, {plan.device})"]
    for part in plan.parts:
        lines.append(f"  {part.name:<24} {size(part.bytes) if part.bytes else '-':>10}  {part.when:<15} {part.how}")
    return [*lines, plan.caption()]


def _device(cfg: TrainConfig, device: torch.device | None) -> torch.device:
    return device if device is not None else pick_device(cfg.train.device)


def show_memory_plan(cfg: TrainConfig, console: Console) -> MemoryPlan:
    """`grpo train plan=true`: the table (plain lines off a terminal), and the warning when it does not
    fit; nothing loads and nothing is written. A bad value fails here as the run would fail."""
    for warning in validate(cfg):
        log.warning(warning)
    device = _device(cfg, None)
    plan = plan_memory(cfg, device, free_memory(device))
    if console_mode(cfg.monitor.console, console) == "rich":
        console.print(plan_table(plan))
    else:
        for line in plan_lines(plan):
            console.print(line, highlight=False, soft_wrap=True)
    if plan.warning():
        log.warning(plan.warning())
    return plan


def log_memory_plan(cfg: TrainConfig, device: torch.device | None = None) -> MemoryPlan | None:
    """Before a run loads its model: the plan in one line, and a warning when it does not fit. A
    model the plan cannot read is the loader's to report, in its own words: the plan stays silent."""
    validate(cfg)  # a bad value fails as setup would say it, not as a plan of nonsense
    device = _device(cfg, device)
    try:
        plan = plan_memory(cfg, device, free_memory(device))
    except GrpoError as err:
        log.debug("memory plan: skipped (%s)", err)
        return None
    log.info(plan.summary())
    if plan.warning():
        log.warning(plan.warning())
    return plan
