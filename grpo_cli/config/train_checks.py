"""The value checks of `grpo train`: every section of the training config, failing before any
model is built, and the warnings for legal but doubtful values.

Its own module because training checks far more than the commands that only sample or score; each
section's checks are a small function, called in the order the errors have always come in.
"""

from __future__ import annotations

import functools
from pathlib import Path

from grpo_cli.config.checks import (
    CHOICES,
    check_at_least_one,
    check_choice,
    check_rewards_chosen,
    check_threads,
    fail,
)
from grpo_cli.config.env_checks import validate_env
from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.group_keys import check_group_keys
from grpo_cli.config.schema import (
    NORMALIZATIONS,
    STRATEGIES,
    TRACKERS,
    AlgoConfig,
    DistributedConfig,
    GuardConfig,
    ModelConfig,
    MonitorConfig,
    OptimConfig,
    PrecisionConfig,
    RewardConfig,
    SandboxConfig,
    TrainConfig,
)
from grpo_cli.core.clip import widest_epsilon_high
from grpo_cli.errors import GrpoError


def validate(cfg: TrainConfig) -> list[str]:
    """Reject impossible values; return warnings for legal but doubtful ones."""
    for key, allowed in CHOICES.items():
        check_choice(key, functools.reduce(getattr, key.split("."), cfg), allowed)
    _check_precision(cfg.precision)
    check_group_keys("curriculum", cfg.curriculum)
    _check_guard(cfg.guard)
    _check_counts(cfg)
    _check_distributed(cfg.distributed)
    if cfg.distributed.strategy == "fsdp" and cfg.algo.ref_sync.every > 0:
        fail(
            "algo.ref_sync.every",
            cfg.algo.ref_sync.every,
            "with distributed.strategy=fsdp is not supported yet (the reference is sharded, and a checkpoint "
            "would keep only the main process's shards of the reference): "
            "use distributed.strategy=ddp or algo.ref_sync.every=0",
        )
    _check_objective(cfg)
    validate_generation(cfg.model, cfg.data, cfg.rollout)
    _check_async(cfg)
    validate_env(cfg.env)
    _check_optim(cfg.optim)
    _check_adaptive_clip(cfg)
    _check_variants(cfg.algo)
    _check_ref_sync(cfg)
    _check_lora(cfg.model)
    _check_mini_batches(cfg)
    _check_monitor(cfg.monitor)
    _check_sandbox(cfg.sandbox)
    _check_reward(cfg.reward)
    return _warnings(cfg)


def _check_precision(precision: PrecisionConfig) -> None:
    check_group_keys("precision", precision)
    if precision.dtype == "fp16" and precision.autocast and not precision.grad_scaler:
        raise GrpoError(
            "precision.dtype=fp16 with precision.autocast=true needs precision.grad_scaler=true: without a "
            "gradient scaler fp16 gradients underflow to zero. Use precision=fp16 (which sets it) or precision=bf16"
        )


def _check_guard(guard: GuardConfig) -> None:
    if guard.reward_cv_threshold <= 0:
        fail("guard.reward_cv_threshold", guard.reward_cv_threshold, "must be > 0")
    if guard.min_abs_mean < 0:
        fail("guard.min_abs_mean", guard.min_abs_mean, "must be >= 0")


def _check_counts(cfg: TrainConfig) -> None:
    check_at_least_one(
        {
            "train.steps": cfg.train.steps,
            "train.prompts_per_step": cfg.train.prompts_per_step,
            "train.grad_accum_steps": cfg.train.grad_accum_steps,
            "algo.num_iterations": cfg.algo.num_iterations,
            "algo.mini_batches": cfg.algo.mini_batches,
            "guard.patience": cfg.guard.patience,
            "guard.max_skipped_steps": cfg.guard.max_skipped_steps,
            "sandbox.workers": cfg.sandbox.workers,
            "reward.max_consecutive_failures": cfg.reward.max_consecutive_failures,
            "monitor.print_every": cfg.monitor.print_every,
            "distributed.num_processes": cfg.distributed.num_processes,
        }
    )
    # every N steps, 0 for never: a negative N would be a step count modulo -N, i.e. every step
    for key in ("save_every", "eval_every", "empty_cache_every"):
        if getattr(cfg.train, key) < 0:
            fail(f"train.{key}", getattr(cfg.train, key), "must be >= 0 (every N steps; 0: never)")
    check_threads("train.threads", cfg.train.threads)


def _check_async(cfg: TrainConfig) -> None:
    """rollout.max_staleness: what the pipelined sampler cannot do, refused naming the conflict."""
    k = cfg.rollout.max_staleness
    if k < 0:
        fail("rollout.max_staleness", k, "must be >= 0 (0: synchronous; k: the sampler runs up to k steps ahead)")
    if k > 0 and cfg.algo.dynamic_sampling.enabled:
        fail(
            "rollout.max_staleness",
            k,
            "with algo.dynamic_sampling: its refill rounds sample and score with the step's own policy until the "
            "groups carry a signal, which a sampler running ahead cannot do; set one of them off",
        )
    if k > 0 and cfg.rollout.backend == "vllm" and cfg.train.eval_every > 0:
        fail(
            "rollout.max_staleness",
            k,
            "with rollout.backend=vllm and train.eval_every: the engine holds the sampler's older weights, and "
            "evaluating them would not score the trained policy; set train.eval_every=0 (grpo eval on a checkpoint)",
        )


def _check_distributed(distributed: DistributedConfig) -> None:
    check_choice("distributed.strategy", distributed.strategy, STRATEGIES)
    if not 0 <= distributed.main_process_port <= 65535:
        fail("distributed.main_process_port", distributed.main_process_port, "must be a port, 0 for a free one")
    if distributed.accelerate_config and not Path(distributed.accelerate_config).is_file():
        fail("distributed.accelerate_config", distributed.accelerate_config, "is not a file")


def _check_objective(cfg: TrainConfig) -> None:
    """What the GRPO update itself needs: groups to compare within, a step size, a clip range, a KL weight."""
    g = cfg.rollout.num_generations
    if g < 2:
        fail("rollout.num_generations", g, "group-relative advantages need at least 2 per prompt")
    if cfg.optim.lr <= 0:
        fail("optim.lr", cfg.optim.lr, "must be > 0")
    for key in ("epsilon_low", "epsilon_high"):
        if getattr(cfg.algo, key) <= 0:
            fail(f"algo.{key}", getattr(cfg.algo, key), "must be > 0")
    if cfg.algo.epsilon_low >= 1:
        fail("algo.epsilon_low", cfg.algo.epsilon_low, "must be < 1 (the ratio is clipped at 1 - epsilon_low)")
    if cfg.algo.beta < 0:
        fail("algo.beta", cfg.algo.beta, "must be >= 0")


def _check_optim(optim: OptimConfig) -> None:
    if optim.max_grad_norm < 0:
        fail("optim.max_grad_norm", optim.max_grad_norm, "must be >= 0 (0 disables clipping)")
    if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
        fail("optim.betas", list(optim.betas), "must be two numbers in [0, 1)")
    if optim.reference_batch < 0 or (optim.lr_scaling != "none" and optim.reference_batch == 0):
        fail(
            "optim.reference_batch",
            optim.reference_batch,
            f"optim.lr_scaling={optim.lr_scaling} needs the completions per optimizer step optim.lr was "
            "tuned for (> 0), e.g. train.prompts_per_step·rollout.num_generations/algo.mini_batches of that run",
        )


def _check_adaptive_clip(cfg: TrainConfig) -> None:
    """algo.adaptive_clip: checked even while disabled, so enabling it later cannot surprise."""
    clip = cfg.algo.adaptive_clip
    for name in ("base", "min", "max"):
        if getattr(clip, name) <= 0:
            fail(f"algo.adaptive_clip.{name}", getattr(clip, name), "must be > 0")
    if clip.max >= 1:
        fail("algo.adaptive_clip.max", clip.max, "must be < 1 (the ratio is clipped at 1 - epsilon)")
    if clip.min > clip.base:
        fail("algo.adaptive_clip.min", clip.min, f"must be <= algo.adaptive_clip.base ({clip.base})")
    if clip.base > clip.max:
        fail("algo.adaptive_clip.base", clip.base, f"must be <= algo.adaptive_clip.max ({clip.max})")
    if clip.window < 2:
        fail("algo.adaptive_clip.window", clip.window, "must be at least 2 (a std needs two batch means)")
    if clip.alpha < 0:
        fail("algo.adaptive_clip.alpha", clip.alpha, "must be >= 0 (0: always base)")


def _check_variants(algo: AlgoConfig) -> None:
    """The optional terms of the objective (docs/architecture.md §3, "Variants"): checked even while
    off, so turning one on later cannot surprise."""
    if algo.entropy_coef < 0:
        fail("algo.entropy_coef", algo.entropy_coef, "must be >= 0 (a bonus for entropy; 0: off)")
    for key in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if getattr(algo, key) <= 0:
            fail(f"algo.{key}", getattr(algo, key), "must be > 0 (the sigmoid gate's temperature)")
    if algo.loss_type in ("cispo", "sapo", "vespo"):
        for key in ("delta", "clip_ratio_c"):
            if getattr(algo, key):
                why = f"bounds the clipped surrogate, which loss_type={algo.loss_type} has not"
                fail(f"algo.{key}", getattr(algo, key), why)
        if algo.adaptive_clip.enabled:
            fail("algo.adaptive_clip.enabled", True, f"adapts a clip range, which loss_type={algo.loss_type} has not")
    if algo.loss_type == "cispo" and algo.epsilon_high < 1:
        fail(
            "algo.epsilon_high",
            algo.epsilon_high,
            "is CISPO's cap on the importance weight (MiniMax-M1 and ScaleRL use about 5): below 1 it scales "
            "down every on-policy token's gradient; algo=cispo sets it",
        )
    widest = widest_epsilon_high(algo.adaptive_clip, algo.epsilon_low, algo.epsilon_high)  # what a step can clip at
    if algo.delta != 0 and algo.delta <= 1 + widest:
        bound = (
            f"{1 + widest:.4g} (1 + algo.adaptive_clip.max·algo.epsilon_high/algo.epsilon_low, the widest epsilon_high "
            "adaptive clipping reaches: at or below it the cap is not TRL's two-sided clip)"
            if algo.adaptive_clip.enabled
            else f"1 + algo.epsilon_high ({1 + algo.epsilon_high})"
        )
        fail("algo.delta", algo.delta, f"must be > {bound}, or 0 (off)")
    if algo.delta != 0 and algo.clip_ratio_c != 0:
        fail("algo.delta", algo.delta, "is the dual-clip bound under TRL's name: set it or algo.clip_ratio_c, not both")
    if algo.clip_ratio_c != 0 and algo.clip_ratio_c <= 1:
        fail("algo.clip_ratio_c", algo.clip_ratio_c, "must be > 1 (verl's dual-clip uses 3.0) or 0 (off)")
    if not 0 <= algo.top_entropy_quantile <= 1:
        fail("algo.top_entropy_quantile", algo.top_entropy_quantile, "must be in [0, 1] (1: every token)")
    if algo.dynamic_sampling.max_draws < 1:
        fail("algo.dynamic_sampling.max_draws", algo.dynamic_sampling.max_draws, "must be >= 1 (the first draw)")
    if algo.rollout_correction.cap <= 1:
        fail("algo.rollout_correction.cap", algo.rollout_correction.cap, "must be > 1 (the weight's upper bound)")
    correction = algo.rollout_correction
    if not 0 <= correction.min < correction.cap:
        why = f"must be in [0, algo.rollout_correction.cap={correction.cap}) (the weight's lower bound; 0: off)"
        fail("algo.rollout_correction.min", correction.min, why)
    if algo.off_policy_mask_threshold is not None and algo.off_policy_mask_threshold < 0:
        fail(
            "algo.off_policy_mask_threshold",
            algo.off_policy_mask_threshold,
            "must be >= 0, in nats per token (DeepSeek-V3.2's delta; TRL suggests 0.5), or null (off): below 0 "
            "it drops negative-advantage sequences that have not drifted at all",
        )
    if algo.router_aux_loss_coef is not None and algo.router_aux_loss_coef < 0:
        fail(
            "algo.router_aux_loss_coef",
            algo.router_aux_loss_coef,
            "must be >= 0 (0: off), or null (the model config's coefficient)",
        )
    _check_vespo(algo)
    _check_adaptive_entropy(algo)


def _check_vespo(algo: AlgoConfig) -> None:
    """algo.vespo: checked even while loss_type is another, so switching to vespo cannot surprise."""
    for sign in ("pos", "neg"):
        if getattr(algo.vespo, f"k_{sign}") < 0:
            fail(f"algo.vespo.k_{sign}", getattr(algo.vespo, f"k_{sign}"), "must be >= 0 (phi's power law below w = 1)")
        if getattr(algo.vespo, f"lambda_{sign}") <= 0:
            why = "must be > 0 (phi's exponential decay above w = 1)"
            fail(f"algo.vespo.lambda_{sign}", getattr(algo.vespo, f"lambda_{sign}"), why)
    if algo.loss_type != "vespo":
        return
    if algo.ratio_level != "token":
        why = "loss_type=vespo builds its own sequence weight from the token ratios: set algo.ratio_level=token"
        fail("algo.ratio_level", algo.ratio_level, why)
    if algo.rollout_correction.mode.startswith("sequence"):
        fail(
            "algo.rollout_correction.mode",
            algo.rollout_correction.mode,
            "loss_type=vespo takes the token weights into its sequence weight (as TRL): use token_truncate, "
            "token_mask or none",
        )


def _check_adaptive_entropy(algo: AlgoConfig) -> None:
    """algo.adaptive_entropy: its bounds checked even while disabled; the start, algo.entropy_coef, when on."""
    control = algo.adaptive_entropy
    for key in ("coef_min", "coef_delta"):
        if getattr(control, key) < 0:
            fail(f"algo.adaptive_entropy.{key}", getattr(control, key), "must be >= 0")
    if control.coef_max < control.coef_min:
        why = f"must be >= algo.adaptive_entropy.coef_min ({control.coef_min})"
        fail("algo.adaptive_entropy.coef_max", control.coef_max, why)
    if control.target < 0:
        fail("algo.adaptive_entropy.target", control.target, "must be >= 0 (a mean token entropy, in nats)")
    if control.enabled and not control.coef_min <= algo.entropy_coef <= control.coef_max:
        fail(
            "algo.entropy_coef",
            algo.entropy_coef,
            "is adaptive entropy's starting coefficient: it must be in [algo.adaptive_entropy.coef_min, "
            f"algo.adaptive_entropy.coef_max] = [{control.coef_min}, {control.coef_max}]",
        )


def _check_ref_sync(cfg: TrainConfig) -> None:
    sync = cfg.algo.ref_sync
    if sync.every < 0:
        fail("algo.ref_sync.every", sync.every, "must be >= 0 (optimizer steps between syncs; 0: off)")
    if not 0 < sync.alpha <= 1:
        fail("algo.ref_sync.alpha", sync.alpha, "must be in (0, 1] (the policy's share of the new reference)")
    if sync.every and cfg.algo.beta == 0:
        fail("algo.ref_sync.every", sync.every, "syncs the KL reference, and algo.beta=0 has none: set algo.beta > 0")
    if sync.every and cfg.model.lora.enabled:
        fail(
            "algo.ref_sync.every",
            sync.every,
            "with model.lora.enabled=true the reference is the frozen base (the adapters off), which cannot "
            "move without a second copy of the weights: train every weight (model.lora.enabled=false) or set it to 0",
        )


def _check_lora(model: ModelConfig) -> None:
    """model.lora: checked even while disabled, so enabling it later cannot surprise."""
    lora = model.lora
    if lora.r < 1:
        fail("model.lora.r", lora.r, "must be at least 1")
    if lora.alpha <= 0:
        fail("model.lora.alpha", lora.alpha, "must be > 0 (the update is scaled by alpha / r)")
    if not 0 <= lora.dropout < 1:
        fail("model.lora.dropout", lora.dropout, "must be in [0, 1)")
    if not lora.target_modules or not all(isinstance(m, str) and m for m in lora.target_modules):
        fail(
            "model.lora.target_modules",
            list(lora.target_modules),
            "must name at least one module, e.g. [q_proj, k_proj, v_proj, o_proj]",
        )


def _check_mini_batches(cfg: TrainConfig) -> None:
    # Each process splits its own share of the groups: 4 prompts over 2 processes leave 2 per process
    # (a share that does not divide evenly is refused by training.distributed.check_divisible).
    processes = cfg.distributed.num_processes
    share = cfg.train.prompts_per_step // processes if cfg.train.prompts_per_step % processes == 0 else None
    if share is not None and cfg.algo.mini_batches > share:
        per_process = "" if processes == 1 else f" / distributed.num_processes={processes} = {share} per process"
        fail(
            "algo.mini_batches",
            cfg.algo.mini_batches,
            f"cannot exceed the prompts each process holds per step (train.prompts_per_step="
            f"{cfg.train.prompts_per_step}{per_process}): mini-batches hold whole groups",
        )


def _check_monitor(monitor: MonitorConfig) -> None:
    for i, tracker in enumerate(monitor.trackers):
        check_choice(f"monitor.trackers[{i}]", tracker, TRACKERS)
    for key in ("repetition_alert", "nan_alert"):
        if not 0 <= getattr(monitor, key) <= 1:
            fail(f"monitor.{key}", getattr(monitor, key), "must be in [0, 1] (0: off)")
    if monitor.hacking_alert < 0:
        fail("monitor.hacking_alert", monitor.hacking_alert, "must be >= 0, in reward units (0: off)")
    for key in ("engine_gap_alert", "copy_gap_alert"):
        if getattr(monitor, key) < 0:
            fail(f"monitor.{key}", getattr(monitor, key), "must be >= 0, in nats per token (0: off)")
    if monitor.hacking_window < 1:
        fail("monitor.hacking_window", monitor.hacking_window, "must be >= 1 (steps)")
    for key in ("log_completions_every", "num_completions_to_print"):
        if getattr(monitor, key) < 0:
            fail(f"monitor.{key}", getattr(monitor, key), "must be >= 0 (0: never)")


def _check_sandbox(sandbox: SandboxConfig) -> None:
    if sandbox.timeout_s <= 0:
        fail("sandbox.timeout_s", sandbox.timeout_s, "must be > 0")
    if sandbox.memory_mb < 32:
        fail("sandbox.memory_mb", sandbox.memory_mb, "must be at least 32 (the interpreter alone needs ~10)")


def _check_reward(reward: RewardConfig) -> None:
    if reward.num_workers < 0:
        fail("reward.num_workers", reward.num_workers, "must be >= 0 (0 scores in the trainer's process)")
    check_rewards_chosen(reward)
    for i, fn in enumerate(reward.functions):
        if fn.weight < 0:
            fail(f"reward.functions[{i}].weight", fn.weight, "must be >= 0")
        if fn.normalize is not None:
            check_choice(f"reward.functions[{i}].normalize", fn.normalize, NORMALIZATIONS)
        if fn.ema_momentum is not None and not 0 <= fn.ema_momentum < 1:
            fail(f"reward.functions[{i}].ema_momentum", fn.ema_momentum, "must be in [0, 1) (null: the default)")
    if not 0 <= reward.ema_momentum < 1:
        fail("reward.ema_momentum", reward.ema_momentum, "must be in [0, 1); 0.9-0.99 typical")


def _warnings(cfg: TrainConfig) -> list[str]:
    warnings = []
    g = cfg.rollout.num_generations
    if not 4 <= g <= 64:
        warnings.append(
            f"rollout.num_generations={g}: groups under 4 give an unreliable std, over 64 make "
            "rollouts dominate the step"
        )
    if cfg.model.kind != "tiny" and cfg.optim.lr == OptimConfig().lr:
        # The schema's lr suits the random tiny model; the model presets cannot carry their own (eval
        # and rollout share conf/model/ and have no optim section), so a pretrained model is warned.
        warnings.append(
            f"optim.lr={cfg.optim.lr:g} is the tiny random-init model's default; a pretrained model "
            "(model.kind=hf) usually wants 1e-6 to 1e-5 (the recipes' SmolLM2 runs use 1e-5): set optim.lr"
        )
    if cfg.algo.loss_type == "luspo" and cfg.algo.ratio_level != "sequence":
        warnings.append(
            "algo.loss_type=luspo sums each sequence's token losses to undo GSPO's length bias: with "
            f"algo.ratio_level={cfg.algo.ratio_level} it weighs long answers more than any paper does; "
            "algo=luspo sets ratio_level=sequence"
        )
    clip = cfg.algo.adaptive_clip
    if clip.enabled and not 0.5 <= clip.base / cfg.algo.epsilon_low <= 2:
        warnings.append(
            f"algo.adaptive_clip.base={clip.base} replaces algo.epsilon_low={cfg.algo.epsilon_low} while "
            "adaptive clipping is on: set base (and min, max) to this preset's scale"
        )
    return warnings
