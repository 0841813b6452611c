"""`precision.*`, `optim.*`, `train.*`, `guard.*`, `distributed.*`, `sweep.*`, `debug.*`: the
training loop around the objective."""

from __future__ import annotations

from dataclasses import dataclass, field

LR_SCALINGS = ("none", "sqrt", "linear")  # optim.lr_scaling
LAYOUTS = ("auto", "packed", "padded")  # train.layout
CPU_HEAPS = ("auto", "system")  # train.cpu_heap
STRATEGIES = ("ddp", "fsdp")  # distributed.strategy


@dataclass
class PrecisionConfig:
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    autocast: bool = False  # true: fp32 master weights, forward passes autocast to dtype; false: weights in dtype
    grad_scaler: bool = False  # fp16 autocast: scale the loss so fp16 gradients do not underflow (CUDA)


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
    # torch CPU threads, >= 0; 0: auto (1 for the tiny model on CPU, else torch's). Above this process's cores
    # is refused, not clamped: the count a config sets is the count that runs
    threads: int = 0
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
class DebugConfig:
    smoke: bool = False  # true (debug=smoke): any config shrunk to seconds: the tiny model, fp32, the sizes below
    steps: int = 2  # smoke: training steps
    max_examples: int = 8  # smoke: prompts loaded from the data set
    prompts_per_step: int = 2  # smoke: prompts per step
    num_generations: int = 2  # smoke: completions per prompt
    max_new_tokens: int = 8  # smoke: completion length


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
