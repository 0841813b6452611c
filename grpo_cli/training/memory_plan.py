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
Here the phases are added up and the overrides tried; each phase's sizes are in
`training.memory_phases`, the model's in `training.model_shape`, what a user reads in
`training.memory_report`.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable

import torch
from rich.console import Console

from grpo_cli.config.schema import PrecisionConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from grpo_cli.models import pick_device
from grpo_cli.monitor.console import console_mode
from grpo_cli.training.memory_phases import generation_phase, nograd_phase, resident_parts, update_phase, worst_batch
from grpo_cli.training.memory_report import MIB, MemoryPlan, Part, plan_lines, plan_table, size
from grpo_cli.training.model_shape import ModelShape, model_config, model_shape

__all__ = [  # the plan's names, wherever they live (benchmarks/memory_plan.py and the tests import them here)
    "MemoryPlan",
    "ModelShape",
    "Part",
    "free_memory",
    "log_memory_plan",
    "model_config",
    "model_shape",
    "plan_lines",
    "plan_memory",
    "plan_table",
    "show_memory_plan",
]

log = logging.getLogger("grpo")

# On a CPU the resident set a run adds exceeds its live tensors. CPU_SLACK: glibc keeps freed blocks
# under its mmap threshold (which grows to 32 MiB: most activation tensors) in per-thread heaps,
# fragmented. benchmarks/memory_plan.py measured it as each default run's peak over the same run with
# MALLOC_MMAP_THRESHOLD_=65536 (every freed block returned: the live peak), over the plan's largest
# phase: tiny30m 0.36-0.51 full and 0.27-0.70 LoRA, SmolLM2 0.20-0.22 full and 0.34 LoRA at dc62f3c
# (0.39-0.41, 0.45-0.77, 0.18-0.24 and 0.33-0.36 in the series before), varying from run to run with
# two threads (docs/speed-memory.md). 0.5 balances the worst: tiny30m LoRA planned at 0.82-0.88 of
# its highest measured peaks, SmolLM2 full at 1.15. CPU_RUNTIME: what the tiny default adds while its
# tensors are a few MiB (torch's thread pools, kernel scratch, autograd and rollout bookkeeping):
# 28-32 MiB above the plan's tensors with live memory, 54-67 MiB in all by default.
# Neither applies on CUDA, where nothing was measured (no GPU in that session): the plan there is its
# tensors against torch.cuda.mem_get_info, and the caching allocator's reserve is not planned.
CPU_SLACK = 0.5
CPU_RUNTIME = 32 * MIB


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
    """The parts, in the order the table shows them, and the peak: resident + the largest phase (+ on a
    CPU the allocator's share of it)."""
    w = worst_batch(cfg, device, shape)
    parts = resident_parts(cfg, shape, w)
    generation = generation_phase(cfg, device, shape, w, parts)
    phases = {"generation": generation, "update": update_phase(cfg, shape, w, parts)}
    nograd = nograd_phase(cfg, shape, w)
    if nograd is not None:
        phases["no-grad passes"] = nograd.bytes
        parts.append(nograd)
    peak = sum(p.bytes for p in parts if p.when == "resident") + max(phases.values())
    if device.type == "cpu":
        slack = int(CPU_SLACK * max(phases.values())) + CPU_RUNTIME
        how = f"{CPU_SLACK:g} x the largest phase + {size(CPU_RUNTIME)}"
        parts.append(Part("CPU allocator + runtime", slack, "allocator", how))
        peak += slack
    processes = cfg.distributed.num_processes
    return MemoryPlan(parts, phases, peak, str(device), free, processes if device.type == "cpu" else 1)


def _knobs(
    cfg: TrainConfig, device: torch.device, free: int | None, shape: ModelShape, peak: int
) -> list[tuple[str, int]]:
    """Overrides that lower the peak by 3% or more, each with the peak it gives: first those that
    leave the training unchanged (grad_accum_steps, checkpointing, autocast), then those that change
    it; when none fits alone, the unchanged-training ones together lead."""
    keep: list[tuple[str, Callable[[TrainConfig], None]]] = []
    change: list[tuple[str, Callable[[TrainConfig], None]]] = []
    accum = cfg.train.grad_accum_steps * 4
    # bnpo's denominator is each micro-batch's tokens (its definition), so only there does it change the update
    (change if cfg.algo.loss_type == "bnpo" else keep).append(
        (f"train.grad_accum_steps={accum}", lambda c: setattr(c.train, "grad_accum_steps", accum))
    )
    if not cfg.model.gradient_checkpointing:
        keep.append(("model.gradient_checkpointing=true", lambda c: setattr(c.model, "gradient_checkpointing", True)))
    if cfg.precision.dtype == "fp32":
        bf16 = PrecisionConfig(dtype="bf16", autocast=True, grad_scaler=False)  # conf/precision/bf16.yaml
        keep.append(("precision=bf16", lambda c: setattr(c, "precision", bf16)))
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
