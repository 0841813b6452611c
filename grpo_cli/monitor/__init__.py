"""What a user sees and keeps of a run: the live console, metrics.jsonl, completion logs."""

from grpo_cli.monitor.console import TrainingConsole, summary_table
from grpo_cli.monitor.files import CompletionLog, MetricsFile, write_summary

__all__ = ["CompletionLog", "MetricsFile", "TrainingConsole", "summary_table", "write_summary"]
