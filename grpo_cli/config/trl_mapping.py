"""Every field of TRL's `GRPOConfig` and what it is in grpo: the one definition behind
`grpo train trl_config=FILE`, the `algo=trl_defaults` preset's test and docs/coming-from-trl.md.

Each field of TRL 1.16's GRPOConfig (its own and the transformers TrainingArguments a GRPO run
turns) is a `TrlField`: TRL's default, the grpo keys it becomes with the conversion when it is more
than a rename (grpo_cli/config/trl_values.py), or, with no keys, why grpo has none. The defaults
are here, not read from TRL, so a file converts without TRL installed; tests/config/test_trl_config.py
holds them to the installed TRL's. A TrainingArguments field not listed is still a valid field of a
TRL config: `trainer_reason` says why grpo has nothing for it. grpo_cli/config/trl_convert.py
applies the table to a file's fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_cli.config import trl_values as v
from grpo_cli.config.trl_values import Converter, Outcome

SERVER = "grpo's vLLM engine runs inside the trainer (TRL's colocate mode); there is no server to reach"
HUB = "grpo pushes nothing to the Hub: `grpo export` writes a Hugging Face directory to upload yourself"
NO_MOE = "grpo's loss has no auxiliary term; a mixture-of-experts model trains on the policy loss alone"


@dataclass(frozen=True)
class TrlField:
    name: str  # GRPOConfig's field
    default: Any  # TRL 1.16's (GRPOConfig's own where it changes TrainingArguments')
    keys: tuple[str, ...] = ()  # the grpo keys (or config groups) it sets; () when none
    note: str = ""  # how the value converts, or, with no keys, why grpo has no equivalent
    convert: Converter | None = None  # None with one key: that key takes the value as it is
    overrides_others: bool = False  # its keys win over another field's (generation_kwargs, as in TRL)

    def outcome(self, value: Any, get: v.Lookup) -> Outcome:
        if self.convert is not None:
            return self.convert(value, get)
        if not self.keys:
            return Outcome(left_out=self.note)
        if isinstance(value, str) and type(self.default) in (int, float):  # YAML 1.1 reads 1e-6 as a string
            value = v.number(value, type(self.default))
        return Outcome({self.keys[0]: value})


def same(name: str, default: Any, key: str, note: str = "") -> TrlField:
    return TrlField(name, default, (key,), note)


def none(name: str, default: Any, why: str) -> TrlField:
    return TrlField(name, default, (), why)


def already(name: str, default: Any, expected: Any, why: str) -> TrlField:
    """No key, because grpo always runs as TRL does at `expected`; another value is left out with `why`."""
    return TrlField(name, default, (), why, v.only(lambda value: value == expected, why))


BATCH_KEYS = ("train.prompts_per_step", "train.grad_accum_steps", "algo.mini_batches")
ONE_PROCESS = "for one process: with N, multiply train.prompts_per_step by N"

SECTIONS: dict[str, tuple[TrlField, ...]] = {
    "Model": (
        TrlField(
            "model_init_kwargs",
            None,
            ("model.dtype", "model.trust_remote_code"),
            "dtype (or torch_dtype) and trust_remote_code; other keys are left out",
            v.model_init_kwargs,
        ),
        same("trust_remote_code", False, "model.trust_remote_code"),
        none("router_aux_loss_coef", None, NO_MOE),
        same("disable_dropout", False, "model.disable_dropout"),
        same("cast_lm_head_to_fp32", False, "model.lm_head_fp32"),
        TrlField(
            "gradient_checkpointing",
            True,
            ("model.gradient_checkpointing",),
            "unless activation_checkpointing is set",
            v.gradient_checkpointing,
        ),
        TrlField(
            "activation_checkpointing",
            None,
            ("model.gradient_checkpointing",),
            "transformers 5's name; None: gradient_checkpointing's value",
            v.activation_checkpointing,
        ),
        none("gradient_checkpointing_kwargs", None, "grpo checkpoints every decoder layer with transformers' defaults"),
    ),
    "Batch and data": (
        TrlField("per_device_train_batch_size", 8, BATCH_KEYS, f"completions; {ONE_PROCESS}", v.batch_field),
        TrlField("gradient_accumulation_steps", 1, BATCH_KEYS, "micro-batches per optimizer step", v.batch_field),
        TrlField("num_generations", 8, ("rollout.num_generations", *BATCH_KEYS), "the group size G", v.num_generations),
        TrlField(
            "generation_batch_size", None, BATCH_KEYS, "completions per step / G = prompts per step", v.batch_field
        ),
        TrlField(
            "steps_per_generation",
            None,
            BATCH_KEYS,
            "algo.mini_batches = steps_per_generation / gradient_accumulation_steps",
            v.batch_field,
        ),
        already("shuffle_dataset", True, True, "grpo always draws the prompts in an order shuffled by train.seed"),
        already(
            "remove_unused_columns",
            False,
            False,
            "grpo always hands every data column to the reward functions",
        ),
        none(
            "num_generations_eval",
            None,
            "train.eval_every scores one greedy answer per held-out prompt; `grpo eval` samples "
            "rollout.num_generations",
        ),
        already(
            "pad_to_multiple_of",
            "auto",
            "auto",
            "grpo packs or pads to the longest row (train.layout); a fixed multiple is for compilers such as Neuron",
        ),
        none("ds3_gather_for_generation", True, "DeepSpeed ZeRO-3 only; grpo shards with FSDP2 (distributed.strategy)"),
    ),
    "Generation": (
        TrlField(
            "max_completion_length",
            512,
            ("rollout.max_new_tokens",),
            "None (no bound) is refused",
            v.none_as(None, "rollout.max_new_tokens", int),
        ),
        same("temperature", 1.0, "rollout.temperature"),
        same("top_p", 1.0, "rollout.top_p"),
        TrlField("top_k", 0, ("rollout.top_k",), "None: 0 (off)", v.none_as(0, "rollout.top_k", int)),
        same("min_p", None, "rollout.min_p"),
        same("repetition_penalty", 1.0, "rollout.repetition_penalty"),
        TrlField(
            "generation_kwargs",
            None,
            ("rollout.generation_kwargs", "rollout.min_new_tokens"),
            "a name with a rollout.* key goes there, winning over that field as in TRL; the rest pass to generation",
            v.generation_kwargs,
            overrides_others=True,
        ),
        TrlField(
            "chat_template_kwargs",
            None,
            ("data.chat_template_kwargs",),
            "None: none",
            v.mapping("data.chat_template_kwargs"),
        ),
        none(
            "cache_implementation",
            None,
            "grpo's fast sampling loop keeps its own KV cache (rollout.loop=fast); generate uses the model's",
        ),
        none(
            "use_transformers_continuous_batching",
            False,
            "grpo's fast loop samples the whole step's rows in one batch (rollout.loop)",
        ),
        none("transformers_continuous_batching_config", None, "see use_transformers_continuous_batching"),
        TrlField(
            "max_tool_calling_iterations",
            None,
            ("env.max_turns",),
            "env.max_turns = value + 1 (the first turn counts there)",
            v.max_turns,
        ),
    ),
    "vLLM": (
        TrlField(
            "use_vllm",
            False,
            ("rollout.backend",),
            "true: vllm, false: hf",
            v.mapped({True: "vllm", False: "hf"}, "rollout.backend"),
        ),
        already("vllm_mode", "colocate", "colocate", SERVER),
        none("vllm_model_impl", "vllm", "grpo's engine uses vLLM's own model implementation"),
        none("vllm_enable_sleep_mode", False, "grpo's engine keeps its memory between steps"),
        none(
            "vllm_structured_outputs_regex",
            None,
            "grpo constrains no output; reward the format instead (reward=format)",
        ),
        none("vllm_server_base_url", None, SERVER),
        none("vllm_server_host", "0.0.0.0", SERVER),
        none("vllm_server_port", 8000, SERVER),
        none("vllm_server_timeout", 240.0, SERVER),
        none("vllm_group_port", 51216, SERVER),
        same("vllm_gpu_memory_utilization", 0.3, "rollout.vllm.gpu_memory_utilization"),
        TrlField(
            "vllm_max_model_length",
            None,
            ("rollout.vllm.max_model_len",),
            "None: 0 (the prompt budget + max_new_tokens)",
            v.none_as(0, "rollout.vllm.max_model_len", int),
        ),
        already(
            "vllm_tensor_parallel_size",
            1,
            1,
            "grpo's engine runs on each process's own GPU, unsplit",
        ),
        TrlField(
            "vllm_importance_sampling_correction",
            True,
            ("algo.rollout_correction.mode",),
            "false: none",
            v.rollout_correction,
        ),
        TrlField(
            "vllm_importance_sampling_mode",
            "sequence_mask",
            ("algo.rollout_correction.mode",),
            "the same mode names",
            v.rollout_correction,
        ),
        TrlField(
            "vllm_importance_sampling_clip_max",
            3.0,
            ("algo.rollout_correction.cap",),
            "None (no upper bound) is kept at grpo's cap",
            v.rollout_correction_cap,
        ),
        TrlField(
            "vllm_importance_sampling_clip_min",
            None,
            ("algo.rollout_correction.min",),
            "None: 0.0 (off)",
            v.none_as(0.0, "algo.rollout_correction.min"),
        ),
    ),
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
            "optimizer steps there; train.steps = max_steps / (num_iterations x mini_batches)",
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
            "None: 0 (never)",
            v.none_as(0, "train.empty_cache_every", int),
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
            "grpo logs every step to metrics.jsonl and the trackers; this paces the plain console",
            lambda value, get: Outcome({"monitor.print_every": v.steps_or_ratio(value, get, "logging_steps")}),
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
            "true: every logging_steps steps (completions/step_N.jsonl), false: 0",
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
        TrlField("eval_steps", None, ("train.eval_every",), "while eval_strategy is steps", v.eval_steps),
        TrlField(
            "save_strategy",
            "steps",
            ("train.save_every",),
            "steps: save_steps; no: 0 (the final checkpoint only)",
            v.save_strategy,
        ),
        TrlField("save_steps", 500, ("train.save_every",), "while save_strategy is steps", v.save_steps),
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

FIELDS: dict[str, TrlField] = {f.name: f for section in SECTIONS.values() for f in section}

# Why grpo has nothing for a TrainingArguments field not in FIELDS, by the start of its name.
TRAINER_REASONS = (
    (("hub_", "push_to_hub"), HUB),
    (
        ("eval_", "per_device_eval", "prediction_loss", "batch_eval", "include_for_metrics", "bf16_full", "fp16_full"),
        "transformers' evaluation loop; grpo evaluates held-out prompts every train.eval_every steps",
    ),
    (
        ("dataloader_", "train_sampling", "length_column", "group_by_length", "label_names"),
        "grpo has no DataLoader: it draws the prompts itself",
    ),
    (
        ("ddp_", "fsdp_", "deepspeed", "accelerator_config", "parallelism_config", "local_rank", "tp_size"),
        "grpo's processes are distributed.* (accelerate launch underneath)",
    ),
    (
        ("log", "report", "run_name", "project", "trackio", "include_num_input", "skip_memory", "disable_tqdm"),
        "grpo's logging is metrics.jsonl, the console (monitor.*) and monitor.trackers",
    ),
    (
        ("save_", "load_best", "metric_for_best", "greater_is_better", "restore_callback", "enable_jit", "ignore_data"),
        "grpo saves whole, atomic checkpoints every train.save_every steps",
    ),
)
TRAINER_FALLBACK = "a transformers Trainer setting that grpo's own training loop has no counterpart for"


def trainer_reason(name: str) -> str:
    for prefixes, reason in TRAINER_REASONS:
        if name.startswith(prefixes):
            return reason
    return TRAINER_FALLBACK
