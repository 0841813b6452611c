"""The TRL fields of how it trains: the loss, the optimizer, the run's length and devices, logging and
checkpoints (the second half of the table in grpo_cli/config/trl/mapping.py)."""

from __future__ import annotations

from grpo_cli.config.trl import values as v
from grpo_cli.config.trl.field import HUB, TrlField, already, none, same
from grpo_cli.config.trl.values import Outcome

R = "rescaled as max_steps"  # a Trainer interval counts optimizer steps, as max_steps does

TRAINING: dict[str, tuple[TrlField, ...]] = {
    "Loss and algorithm": (
        same("beta", 0.0, "algo.beta"),
        same("num_iterations", 1, "algo.num_iterations"),
        TrlField(
            "epsilon",
            0.2,
            ("algo.epsilon_low", "algo.epsilon_high"),
            "epsilon_high too, unless it is set",
            v.epsilon,
        ),
        TrlField("epsilon_high", None, ("algo.epsilon_high",), "None: epsilon", v.epsilon_high),
        TrlField("delta", None, ("algo.delta",), "None: 0.0 (off)", v.none_as(0.0, "algo.delta")),
        same("sapo_temperature_neg", 1.05, "algo.sapo_temperature_neg"),
        same("sapo_temperature_pos", 1.0, "algo.sapo_temperature_pos"),
        same("vespo_k_pos", 2.0, "algo.vespo.k_pos"),
        same("vespo_lambda_pos", 3.0, "algo.vespo.lambda_pos"),
        same("vespo_k_neg", 3.0, "algo.vespo.k_neg"),
        same("vespo_lambda_neg", 2.0, "algo.vespo.lambda_neg"),
        same("importance_sampling_level", "token", "algo.ratio_level"),
        TrlField(
            "reward_weights",
            None,
            ("reward.functions.N.weight",),
            "in the order of reward.functions; weighted_mean divides by their sum, so only ratios count",
            lambda value, get: Outcome(
                {f"reward.functions.{i}.weight": v.number(w) for i, w in enumerate(value or [])}
            ),
        ),
        TrlField(
            "multi_objective_aggregation",
            "sum_then_normalize",
            ("reward.aggregation",),
            "sum_then_normalize: weighted_mean (the same advantages under scale_rewards=group)",
            v.mapped(
                {"sum_then_normalize": "weighted_mean", "normalize_then_sum": "normalize_then_sum"},
                "reward.aggregation",
            ),
        ),
        TrlField(
            "scale_rewards",
            "group",
            ("algo.scale_rewards",),
            "true: group, false: none",
            v.mapped(
                {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"},
                "algo.scale_rewards",
            ),
        ),
        same("loss_type", "dapo", "algo.loss_type"),
        same("mask_truncated_completions", False, "algo.mask_truncated"),
        TrlField(
            "sync_ref_model",
            False,
            ("algo.ref_sync.every",),
            "false: 0 (off), true: ref_model_sync_steps",
            v.ref_sync_every,
        ),
        same("ref_model_mixup_alpha", 0.6, "algo.ref_sync.alpha"),
        TrlField(
            "ref_model_sync_steps",
            512,
            ("algo.ref_sync.every",),
            "while sync_ref_model is true; optimizer steps in both",
            v.ref_sync_every,
        ),
        same("top_entropy_quantile", 1.0, "algo.top_entropy_quantile"),
        same("entropy_coef", 0.0, "algo.entropy_coef"),
        same("use_adaptive_entropy", False, "algo.adaptive_entropy.enabled"),
        same("entropy_coef_min", 0.0, "algo.adaptive_entropy.coef_min"),
        same("entropy_coef_max", 1.0, "algo.adaptive_entropy.coef_max"),
        same("entropy_coef_delta", 0.005, "algo.adaptive_entropy.coef_delta"),
        same("entropy_target", 0.2, "algo.adaptive_entropy.target"),
        same("off_policy_mask_threshold", None, "algo.off_policy_mask_threshold"),
        same("use_bias_correction_kl", True, "algo.kl_ratio_correction"),
    ),
    "Optimizer and schedule": (
        same("learning_rate", 1e-6, "optim.lr"),
        TrlField(
            "lr_scheduler_type",
            "linear",
            ("optim.scheduler", "optim.warmup_steps"),
            "constant (warm-up 0), constant_with_warmup (constant), linear, cosine; others are refused",
            v.lr_scheduler_type,
        ),
        none("lr_scheduler_kwargs", None, "grpo's schedules take no extra parameters"),
        TrlField(
            "warmup_steps",
            0,
            ("optim.warmup_steps",),
            "optimizer steps in both; below 1, a share of max_steps",
            lambda value, get: v.warmup(value, get, "warmup_steps"),
        ),
        TrlField(
            "warmup_ratio",
            0.0,
            ("optim.warmup_steps",),
            "transformers 4 only: ceil(ratio x max_steps)",
            v.warmup_ratio,
        ),
        same("weight_decay", 0.0, "optim.weight_decay"),
        TrlField("adam_beta1", 0.9, ("optim.betas",), "[adam_beta1, adam_beta2]", v.adam_betas),
        TrlField("adam_beta2", 0.999, ("optim.betas",), "[adam_beta1, adam_beta2]", v.adam_betas),
        already("adam_epsilon", 1e-8, 1e-8, "grpo's AdamW keeps torch's eps, 1e-8"),
        TrlField(
            "optim",
            "adamw_torch_fused",
            (),
            "grpo's optimizer is torch's AdamW, fused where the parameters allow; other optimizers are left out",
            v.only(lambda value: value in ("adamw_torch", "adamw_torch_fused"), "grpo's optimizer is torch's AdamW"),
        ),
        same("max_grad_norm", 1.0, "optim.max_grad_norm"),
    ),
    "Run length, precision and devices": (
        TrlField(
            "max_steps",
            -1,
            ("train.steps",),
            "optimizer steps there; train.steps = max_steps / (num_iterations x mini_batches), and each "
            "Trainer interval (save, eval, logging steps) / the same, rounded down",
            v.max_steps,
        ),
        none(
            "num_train_epochs",
            3.0,
            "grpo counts steps (train.steps); an epoch of P prompts is P / train.prompts_per_step steps",
        ),
        same("seed", 42, "train.seed"),
        none(
            "data_seed",
            None,
            "the prompt order follows train.seed; data.seed draws the arithmetic task and the held-out split",
        ),
        TrlField(
            "bf16", None, ("precision",), "precision=bf16 (fp32 weights, bf16 autocast); None: bf16 unless fp16", v.bf16
        ),
        TrlField("fp16", False, ("precision",), "precision=fp16", v.fp16),
        none("tf32", None, "grpo leaves torch's matmul precision as it is"),
        TrlField(
            "use_cpu",
            False,
            ("train.device",),
            "true: cpu, false: auto",
            v.mapped({True: "cpu", False: "auto"}, "train.device"),
        ),
        TrlField(
            "torch_empty_cache_steps",
            None,
            ("train.empty_cache_every",),
            f"None: 0 (never); {R}",
            lambda value, get: Outcome(
                {"train.empty_cache_every": 0 if value is None else v.interval(value, get, "torch_empty_cache_steps")}
            ),
        ),
        none("torch_compile", False, "grpo runs the model eagerly"),
        none("use_liger_kernel", False, "grpo computes log-probs with its own chunked log-softmax"),
        already("average_tokens_across_devices", True, True, "grpo's denominators always count every process"),
        TrlField(
            "fsdp",
            None,
            ("distributed.strategy",),
            "any sharding: fsdp (FSDP2); the process count is distributed.num_processes",
            lambda value, get: Outcome({"distributed.strategy": "fsdp"}) if value else Outcome(),
        ),
        none("deepspeed", None, "grpo shards with FSDP2 (distributed.strategy=fsdp)"),
    ),
    "Logging, evaluation and checkpoints": (
        TrlField(
            "output_dir",
            None,
            ("hydra.run.dir",),
            "the run directory",
            lambda value, get: Outcome({"hydra.run.dir": str(value)}) if value else Outcome(),
        ),
        TrlField(
            "report_to",
            "none",
            ("monitor.trackers",),
            "none: []; a name or a list of grpo's trackers",
            v.report_to,
        ),
        TrlField(
            "logging_steps",
            10,
            ("monitor.print_every",),
            f"grpo logs every step to metrics.jsonl and the trackers; this paces the plain console; {R}",
            lambda value, get: Outcome({"monitor.print_every": v.interval(value, get, "logging_steps")}),
        ),
        none(
            "logging_strategy",
            "steps",
            "grpo logs every step to metrics.jsonl and the trackers (monitor.print_every paces the console)",
        ),
        none("logging_first_step", False, "grpo always logs the first step"),
        TrlField(
            "log_completions",
            False,
            ("monitor.log_completions_every",),
            f"true: every logging_steps steps (completions/step_N.jsonl; {R}), false: 0",
            v.log_completions,
        ),
        TrlField(
            "num_completions_to_print",
            None,
            ("monitor.num_completions_to_print",),
            "None (all) is left out: give a number",
            lambda value, get: (
                Outcome({"monitor.num_completions_to_print": v.number(value, int)})
                if value is not None
                else Outcome(left_out="None prints every logged completion; grpo needs a number")
            ),
        ),
        none("log_unique_prompts", False, "grpo's completion files hold every row of the logged step"),
        none("log_multimodal", True, "grpo trains on text"),
        none("log_completions_hub_repo", None, HUB),
        TrlField(
            "eval_strategy",
            "no",
            ("train.eval_every",),
            "no: 0; steps: eval_steps (or logging_steps); on data.eval_fraction's held-out prompts",
            v.eval_strategy,
        ),
        TrlField("eval_steps", None, ("train.eval_every",), f"while eval_strategy is steps; {R}", v.eval_steps),
        TrlField(
            "save_strategy",
            "steps",
            ("train.save_every",),
            "steps: save_steps; no: 0 (the final checkpoint only)",
            v.save_strategy,
        ),
        TrlField("save_steps", 500, ("train.save_every",), f"while save_strategy is steps; {R}", v.save_steps),
        none("save_total_limit", None, "grpo keeps every checkpoint it writes"),
        TrlField(
            "resume_from_checkpoint",
            None,
            ("train.resume",),
            "a checkpoint path; None: auto (the run directory's newest)",
            lambda value, get: Outcome({"train.resume": str(value)}) if value else Outcome(),
        ),
        none("push_to_hub", False, HUB),
        none(
            "disable_tqdm",
            None,
            "grpo's console is monitor.console: a live panel on a terminal, plain lines otherwise",
        ),
    ),
    "Deprecated in TRL": (
        none("use_transformers_paged", False, "see use_transformers_continuous_batching"),
        TrlField(
            "vllm_importance_sampling_cap",
            None,
            ("algo.rollout_correction.cap",),
            "vllm_importance_sampling_clip_max's old name",
            v.rollout_correction_cap,
        ),
    ),
}
