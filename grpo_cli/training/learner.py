"""The update's moving parts, built from the config once per run: the optimizer and its schedule
sized to the run's optimizer steps, the DDP wrapper or the FSDP2 copy, mixed precision and the fixed
update settings."""

from __future__ import annotations

import torch

from grpo_cli.config.schema import PrecisionConfig, TrainConfig
from grpo_cli.core.optim import build_optimizer, completions_per_step, effective_lr
from grpo_cli.core.precision import autocast_factory, gradient_scaler
from grpo_cli.core.update import Learner, UpdateSettings
from grpo_cli.training.distributed import World, data_parallel_model
from grpo_cli.training.sharding import shard, sharded_run


def build_learner(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    cfg: TrainConfig,
    precision: PrecisionConfig,
    world: World,
    device: torch.device,
    layout: str,
    router_aux_loss_coef: float,
) -> tuple[Learner, UpdateSettings, float]:
    """(learner, settings, effective lr). The update's forward and backward go through DDP
    (gradients averaged) or an FSDP2 copy (sharded, gathered back after each update by the
    trainer); sampling, the reference and checkpoints use the module itself. `layout` and
    `router_aux_loss_coef`: resolved against the model (training.layout)."""
    updates_per_step = cfg.algo.num_iterations * cfg.algo.mini_batches  # exact: mini-batches are planned
    batch = completions_per_step(cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.algo.mini_batches)
    if sharded_run(cfg.distributed, world.size):  # the update on a sharded copy (training.sharding)
        train_model = shard(model, device, cfg.distributed, precision, copy_first=True)
        optimized = train_model  # the copy's sharded parameters, not the whole module's
        if isinstance(reference, torch.nn.Module):  # a frozen copy (a LoRA run: the policy, adapters off)
            reference = shard(reference, device, cfg.distributed, precision, copy_first=False)
    else:  # DDP's wrapper holds the module's own parameters
        train_model = data_parallel_model(model, device) if world.size > 1 else model
        optimized = model
    optimizer, scheduler = build_optimizer(optimized, cfg.optim, cfg.train.steps * updates_per_step, batch)
    autocast, scaler = autocast_factory(device, precision), gradient_scaler(precision, device)
    learner = Learner(train_model, optimizer, scheduler, reference, autocast, scaler, world, updates_per_step)
    train, optim = cfg.train, cfg.optim
    settings = UpdateSettings(
        cfg.rollout.temperature,
        cfg.rollout.max_new_tokens,
        train.grad_accum_steps,
        optim.max_grad_norm,
        layout,
        router_aux_loss_coef,
    )
    return learner, settings, effective_lr(cfg.optim, batch)  # optim.lr scaled to the batch (optim.lr_scaling)
