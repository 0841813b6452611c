"""What a user sees and keeps of a run: observers of finished steps (console, metrics.jsonl,
completion logs) and the summary."""

from grpo_cli.monitor.console import TrainingConsole, summary_table
from grpo_cli.monitor.files import CompletionLog, MetricsFile, truncate_metrics, write_summary
from grpo_cli.monitor.observer import Observer, StepResult, reward_function_names

__all__ = [
    "CompletionLog",
    "MetricsFile",
    "Observer",
    "StepResult",
    "TrainingConsole",
    "reward_function_names",
    "summary_table",
    "truncate_metrics",
    "write_summary",
]
