"""The TRL fields of what is sampled: the model, the batch, generation and vLLM (the first half of
the table in grpo_cli/config/trl/mapping.py)."""

from __future__ import annotations

from grpo_cli.config.trl import server
from grpo_cli.config.trl import values as v
from grpo_cli.config.trl.field import TrlField, already, none, same

BATCH_KEYS = ("train.prompts_per_step", "train.grad_accum_steps", "algo.mini_batches")
ONE_PROCESS = "for one process: with N, multiply train.prompts_per_step by N"

SAMPLING: dict[str, tuple[TrlField, ...]] = {
    "Model": (
        TrlField(
            "model_init_kwargs",
            None,
            ("model.dtype", "model.trust_remote_code"),
            "dtype (or torch_dtype) and trust_remote_code; other keys are left out",
            v.model_init_kwargs,
        ),
        same("trust_remote_code", False, "model.trust_remote_code"),
        same("router_aux_loss_coef", None, "algo.router_aux_loss_coef"),
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
        TrlField(
            "vllm_mode",
            "colocate",
            ("rollout.vllm.mode", "rollout.vllm.server_url"),
            "colocate: colocated; server: server, at the server fields' URL. Start the server with grpo's "
            "command, not `trl vllm-serve` (docs/scaling.md#vllm-server-mode)",
            server.vllm_mode,
        ),
        none("vllm_model_impl", "vllm", "grpo's engine uses vLLM's own model implementation"),
        none("vllm_enable_sleep_mode", False, "grpo's engine keeps its memory between steps"),
        none(
            "vllm_structured_outputs_regex",
            None,
            "grpo constrains no output; reward the format instead (reward=format)",
        ),
        TrlField(
            "vllm_server_base_url",
            None,
            ("rollout.vllm.server_url",),
            "server mode only; when set, host and port are ignored (as in TRL)",
            server.base_url,
        ),
        TrlField(
            "vllm_server_host",
            "0.0.0.0",
            ("rollout.vllm.server_url",),
            "server mode only: http://HOST:PORT; 0.0.0.0, TRL's listen-anywhere default, is this machine: 127.0.0.1",
            server.host,
        ),
        TrlField("vllm_server_port", 8000, ("rollout.vllm.server_url",), "see vllm_server_host", server.port),
        TrlField(
            "vllm_server_timeout",
            240.0,
            ("rollout.vllm.ready_timeout",),
            "server mode only; seconds to wait for the server to be up",
            server.server_timeout,
        ),
        none(
            "vllm_group_port",
            51216,
            "grpo pushes weights to the server through a shared-memory file or HTTP, with no NCCL group to open",
        ),
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
}
