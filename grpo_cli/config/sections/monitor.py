"""`monitor.*` and `eval.*`: what a user sees during a run, and when a completion counts as solved."""

from __future__ import annotations

from dataclasses import dataclass, field

CONSOLES = ("auto", "rich", "plain", "quiet")  # monitor.console
TRACKERS = ("tensorboard", "wandb", "mlflow", "aim")  # monitor.trackers: accelerate tracker names


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
class EvalMetricsConfig:
    """`eval.*`: when a completion counts as solved (`grpo eval`, and `train.eval_every`'s
    eval/accuracy), and which pass@k `grpo eval` reports."""

    success: str | None = None  # reward function whose raw score decides; None: the first of reward.functions
    success_threshold: float = 1.0  # solved when that score >= this
    k: list[int] = field(default_factory=lambda: [1, 5])  # pass@k for each; every k <= rollout.num_generations
