"""Typed schema of every config key: each command's config, composed from the sections in
`config/sections/` (one module per area of keys), whose names this module re-exports.

The dataclasses are the single source of truth for names and types, and their defaults are the
default run: `TrainConfig()` equals what `grpo train` composes with no overrides (conf/train.yaml
and each group's default option), `ScoreConfig()` what `grpo score` composes; the YAML files
repeat the values with comments for users to read, and tests/config/test_defaults.py keeps the
two in step. They import nothing from Hydra so the core can take them as plain arguments;
`grpo_cli.commands.entry` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_cli.config.sections.algo import (
    LOSS_TYPES,
    ROLLOUT_CORRECTIONS,
    AdaptiveClipConfig,
    AdaptiveEntropyConfig,
    AlgoConfig,
    DynamicSamplingConfig,
    RefSyncConfig,
    RolloutCorrectionConfig,
    VespoConfig,
)
from grpo_cli.config.sections.data import LONG_PROMPT_POLICIES, DataConfig
from grpo_cli.config.sections.env import ENVIRONMENTS, TOKEN_MODES, EnvConfig
from grpo_cli.config.sections.model import LoraConfig, ModelConfig, TinyModelConfig
from grpo_cli.config.sections.monitor import CONSOLES, TRACKERS, EvalMetricsConfig, MonitorConfig
from grpo_cli.config.sections.reward import (
    CURRICULA,
    INTERPOLATIONS,
    NORMALIZATIONS,
    ON_ROW_ERROR,
    CurriculumConfig,
    CurriculumPhase,
    RewardConfig,
    RewardFunctionConfig,
    SandboxConfig,
)
from grpo_cli.config.sections.rollout import (
    ROLLOUT_BACKENDS,
    ROLLOUT_LOOPS,
    SAMPLING_WEIGHTS,
    ResumableRolloutConfig,
    RolloutConfig,
    VllmConfig,
)
from grpo_cli.config.sections.training import (
    CPU_HEAPS,
    LAYOUTS,
    LR_SCALINGS,
    STRATEGIES,
    DebugConfig,
    DistributedConfig,
    GuardConfig,
    OptimConfig,
    PrecisionConfig,
    SweepConfig,
    TrainLoopConfig,
)

__all__ = [
    "CONSOLES",
    "CPU_HEAPS",
    "CURRICULA",
    "ENVIRONMENTS",
    "EXPORT_DTYPES",
    "INTERPOLATIONS",
    "LAYOUTS",
    "LONG_PROMPT_POLICIES",
    "LOSS_TYPES",
    "LR_SCALINGS",
    "NORMALIZATIONS",
    "ON_ROW_ERROR",
    "ROLLOUT_BACKENDS",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_LOOPS",
    "SAMPLING_WEIGHTS",
    "SPLITS",
    "STRATEGIES",
    "TOKEN_MODES",
    "TRACKERS",
    "AdaptiveClipConfig",
    "AdaptiveEntropyConfig",
    "AlgoConfig",
    "CheckConfig",
    "CurriculumConfig",
    "CurriculumPhase",
    "DataConfig",
    "DebugConfig",
    "DistributedConfig",
    "DynamicSamplingConfig",
    "EnvConfig",
    "EvalConfig",
    "EvalMetricsConfig",
    "ExportConfig",
    "GuardConfig",
    "LoraConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimConfig",
    "PrecisionConfig",
    "RefSyncConfig",
    "ResumableRolloutConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "RolloutRunConfig",
    "SandboxConfig",
    "ScoreConfig",
    "SweepConfig",
    "TinyModelConfig",
    "TrainConfig",
    "TrainLoopConfig",
    "VespoConfig",
    "VllmConfig",
]

SPLITS = ("all", "train", "eval")  # rollout split: the whole data set or one side of data.eval_fraction


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
    threads: int = 0  # torch CPU threads, at most the cores; 0: auto (1 for the tiny model on CPU, else torch's)
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
class CheckConfig:
    """`grpo check`: the model zoo's equalities (tests/zoo) on one model: which sampling loop and layout it
    trains with, sampler = forward, packed = padded, LoRA's default targets, FSDP's blocks, export and reload."""

    seed: int = 0  # sampling seed (and the tiny model's)
    model: ModelConfig = field(default_factory=ModelConfig)


@dataclass
class RolloutRunConfig:
    """`grpo rollout`: G completions per prompt of a data set, streamed to the jsonl `grpo score` reads."""

    output: str | None = None  # None: rollouts.jsonl in the run directory
    split: str = "all"  # SPLITS: train/eval are data.eval_fraction's sides, as the trainer splits them
    batch_size: int = 8  # prompts per generate call (each with rollout.num_generations rows)
    max_prompts: int = 0  # 0: every prompt of the split
    seed: int = 0  # torch is reseeded per batch from it: same seed, same file, also across a resume
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads, at most the cores; 0: auto (1 for the tiny model on CPU, else torch's)
    console: str = "auto"  # CONSOLES: progress bar on a terminal, plain lines otherwise
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: ResumableRolloutConfig = field(default_factory=ResumableRolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # env=code_feedback runs the tests here
