"""What `grpo eval` and the trainer's periodic eval measure on scored completions: accuracy,
unbiased pass@k, mean rewards, lengths and truncation. Plain Python on lists, no torch."""

from grpo_cli.evaluation.metrics import (
    ScoredSamples,
    SuccessRule,
    greedy_answers,
    mean_pass_at_k,
    pass_at_k,
    sample_metrics,
)

__all__ = ["ScoredSamples", "SuccessRule", "greedy_answers", "mean_pass_at_k", "pass_at_k", "sample_metrics"]
