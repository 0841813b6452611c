"""`grpo score`: score a rollouts file with the configured rewards, in a stream."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from grpo_cli.config.schema import ScoreConfig
from grpo_cli.errors import GrpoError
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.rewards import RewardExecutor, RewardFusion, resolve_reward_sources, reward_diagnostics
from grpo_cli.scoring import score_rollouts_file


def summary_table(summary: dict) -> Table:
    table = Table(title=f"grpo score: {summary['completions']} completions of {summary['prompts']} prompts")
    for column in ("function", "mean", "std", "NaN", "weight effect"):
        table.add_column(column, justify="left" if column == "function" else "right")
    effect = summary["weight_effect"]
    for name, stats in summary["functions"].items():
        mean = "-" if stats["mean"] is None else f"{stats['mean']:.4f}"
        share = f"{effect[name]:.3f}" if name in effect else "-"
        masked = " (masked)" if name in summary["masked_functions"] else ""
        table.add_row(name + masked, mean, f"{stats['std']:.4f}", str(stats["nan_count"]), share)
    fused = summary["reward"]
    fused_mean = "-" if fused["mean"] is None else f"{fused['mean']:.4f}"
    table.add_row("[bold]fused", fused_mean, f"{fused['std']:.4f}", str(fused["nan_count"]), "")
    return table


def summary_path(cfg: ScoreConfig) -> Path:
    """`summary`, else OUTPUT.summary.json beside the output and named after it (as rollout's
    OUTPUT.meta.json): two scorings in one directory each keep their own."""
    output = Path(cfg.output)
    return Path(cfg.summary) if cfg.summary else output.with_name(output.name + ".summary.json")


def run_score(cfg: ScoreConfig, run_dir: Path | None = None) -> float:
    """Returns the mean fused reward (the objective, for sweeps over reward settings).

    `run_dir` is unused: score writes only the files it is asked to.
    """
    if not cfg.input or not cfg.output:
        raise GrpoError("grpo score needs input=ROLLOUTS.jsonl and output=SCORED.jsonl")
    if cfg.batch_size < 1:
        raise GrpoError(f"invalid value batch_size={cfg.batch_size}: must be at least 1")
    if Path(cfg.output).exists():  # as grpo rollout refuses: a scored file may be all that is left of an expensive run
        raise GrpoError(
            f"output={cfg.output} already exists: grpo score does not overwrite; delete it or choose another"
        )
    summary_file = summary_path(cfg)
    if summary_file.exists():  # another scoring's figures: refused before any work, as the output is
        raise GrpoError(
            f"summary={summary_file} already exists: grpo score does not overwrite; delete it or set summary=PATH"
        )
    if not cfg.reward.functions:
        raise GrpoError("reward.functions is empty: choose a reward, e.g. reward=math")
    sources = resolve_reward_sources(cfg.reward.functions, sandbox=cfg.sandbox, chat=cfg.data.chat)
    diagnostics = reward_diagnostics(sources)  # e.g. the sandbox backend, also in the summary file
    fusion = RewardFusion.from_config(sources, cfg.reward)
    count_tokens = None
    if cfg.tokenizer:
        from grpo_cli.models import load_tokenizer  # transformers only when asked to count

        tokenizer = load_tokenizer(cfg.tokenizer)

        def count_tokens(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    with RewardExecutor(cfg.reward.num_workers, cfg.reward.timeout_s) as executor:
        summary = score_rollouts_file(
            Path(cfg.input),
            Path(cfg.output),
            fusion,
            executor,
            cfg.algo.scale_rewards,
            cfg.batch_size,
            count_tokens,
        )
    summary.update(diagnostics)
    summary_file.write_text(json.dumps(summary, indent=2) + "\n")
    console = stderr_console()
    for alert in summary["alerts"]:
        console.print(f"[bold yellow]alert:[/] {escape(alert)}", highlight=False)
    console.print(summary_table(summary))
    for key, value in diagnostics.items():
        console.print(f"{key.replace('_', ' ')}: {value}", highlight=False)
    console.print(f"wrote {cfg.output} and {summary_file}", highlight=False, soft_wrap=True)
    mean = summary["reward"]["mean"]
    return float("nan") if mean is None else mean
