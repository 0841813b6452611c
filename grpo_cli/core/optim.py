"""AdamW and the learning-rate schedule, counted in optimizer steps, with the lr scaled to the batch."""

from __future__ import annotations

import math
import re
import warnings

import torch
from transformers import get_scheduler

from grpo_cli.config.schema import LR_SCALINGS, OptimConfig
from grpo_cli.errors import GrpoError

SCHEDULERS = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}


def completions_per_step(prompts_per_step: int, num_generations: int, mini_batches: int) -> float:
    """B of the lr scaling: the completions behind one optimizer step (each mini-batch is one step;
    gradient accumulation splits a mini-batch, not the step). A mean when groups do not divide evenly.

    >>> completions_per_step(16, 8, 4)
    32.0
    """
    return prompts_per_step * num_generations / mini_batches


def effective_lr(optim: OptimConfig, completions_per_optimizer_step: float) -> float:
    """optim.lr scaled from the batch it was tuned for (optim.reference_batch) to this one, B
    (docs/architecture.md §3, seed 001): `sqrt` lr·sqrt(B/B_ref) (the noise of an Adam step falls as 1/sqrt(B)),
    `linear` lr·B/B_ref (the SGD rule), `none` lr.

    >>> effective_lr(OptimConfig(lr=1e-6, lr_scaling="sqrt", reference_batch=32), 128)
    2e-06
    """
    mode, ref, batch = optim.lr_scaling, optim.reference_batch, completions_per_optimizer_step
    if mode not in LR_SCALINGS:
        raise GrpoError(f"optim.lr_scaling '{mode}' is not one of {', '.join(LR_SCALINGS)}")
    if mode == "none":
        return optim.lr
    if ref <= 0:
        raise GrpoError(f"optim.lr_scaling={mode} needs optim.reference_batch > 0 (got {ref})")
    if batch <= 0:
        raise ValueError(f"completions per optimizer step must be > 0, got {batch}")
    ratio = batch / ref
    return optim.lr * (math.sqrt(ratio) if mode == "sqrt" else ratio)


def fusable(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch's fused AdamW (one kernel over every tensor, CPU and CUDA) takes these
    parameters: about 4 times faster than the per-tensor loop on CPU, the same update."""
    kinds = {p.device.type for p in params}
    plain = all(type(p.data) is torch.Tensor for p in params)  # FSDP2's DTensors take the per-tensor loop
    floats = all(p.is_floating_point() for p in params)
    return bool(params) and plain and floats and kinds <= {"cpu", "cuda"} and len(kinds) == 1


def build_optimizer(
    model: torch.nn.Module,
    cfg: OptimConfig,
    total_optimizer_steps: int,
    completions_per_optimizer_step: float | None = None,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW at effective_lr(cfg, completions_per_optimizer_step) and its schedule. The batch size
    may be left out only while optim.lr_scaling is `none`."""
    if completions_per_optimizer_step is None:
        if cfg.lr_scaling != "none":
            raise GrpoError(f"optim.lr_scaling={cfg.lr_scaling}: build_optimizer needs the completions per step")
        lr = cfg.lr
    else:
        lr = effective_lr(cfg, completions_per_optimizer_step)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fusable(params) or None
    )
    scheduler = get_scheduler(
        SCHEDULERS[cfg.scheduler],
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=total_optimizer_steps,
    )
    return optimizer, scheduler


def schedule_at(scheduler: torch.optim.lr_scheduler.LambdaLR, position: int) -> float:
    """Move the schedule to `position` optimizer steps from the start and set the optimizer's lr
    there; returns it. The trainer puts each training step at its planned position, so the lr is a
    function of the step, as the curriculum's weights are, whatever a short or skipped update did
    before (docs/architecture.md §3, "Optimizer"). A LambdaLR is closed-form in `last_epoch`."""
    scheduler.last_epoch = position - 1
    with warnings.catch_warnings():  # torch's check of the optimizer-then-scheduler order does not apply to a move
        warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()` before"), UserWarning)
        scheduler.step()
    return scheduler.get_last_lr()[0]
