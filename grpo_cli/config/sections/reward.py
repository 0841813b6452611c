"""`reward.*`, `sandbox.*`, `curriculum.*`: the reward functions, where code rewards run their code,
and how the functions' weights move over a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NORMALIZATIONS = ("none", "zscore", "sigmoid", "group_zscore")  # reward.functions[].normalize
ON_ROW_ERROR = ("zero", "skip")  # reward.functions[].on_row_error
CURRICULA = ("constant", "three_phase", "phased")  # curriculum.name
INTERPOLATIONS = ("step", "linear")  # curriculum.interpolate


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
