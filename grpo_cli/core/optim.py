"""AdamW and the learning-rate schedule, counted in optimizer steps."""

from __future__ import annotations

import torch
from transformers import get_scheduler

from grpo_cli.config.schema import OptimConfig

SCHEDULERS = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_optimizer_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    scheduler = get_scheduler(
        SCHEDULERS[cfg.scheduler],
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=total_optimizer_steps,
    )
    return optimizer, scheduler
