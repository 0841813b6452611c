"""`grpo train`: run the GRPO loop on the composed config and write the run directory."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

import transformers
from omegaconf import OmegaConf
from rich.console import Console

from grpo_cli.config import TrainConfig, apply_smoke
from grpo_cli.core.checkpoint import latest_checkpoint
from grpo_cli.monitor import CompletionLog, MetricsFile, TrainingConsole, summary_table, write_summary
from grpo_cli.stats import nanmean
from grpo_cli.training import GRPOTrainer

log = logging.getLogger("grpo")
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT
transformers.utils.logging.disable_progress_bar()  # the rich bar is the one progress display


def _mean(rows: list[dict], key: str) -> float | None:
    value = nanmean([r[key] for r in rows if isinstance(r.get(key), (int, float))])
    return None if math.isnan(value) else value


def run_train(cfg: TrainConfig, run_dir: Path) -> float:
    """The task function: returns the last-10-steps mean reward, the objective sweepers use."""
    if cfg.debug.smoke:
        apply_smoke(cfg)
    console = Console(stderr=True)
    metrics_file = MetricsFile(run_dir / "metrics.jsonl")
    progress = TrainingConsole(cfg.train.steps, console, enabled=cfg.monitor.progress)
    observers = [metrics_file, CompletionLog(run_dir / "completions", cfg.monitor.log_completions_every), progress]
    trainer = GRPOTrainer(cfg, run_dir, observers)
    start = time.perf_counter()
    trainer.setup()  # validates first: a bad value fails before any model is built
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml")
    if trainer.resumed_from:
        log.info("resuming from %s (step %d)", trainer.resumed_from, trainer.step_index)
    log.info("run directory: %s", run_dir)
    for key, value in trainer.reward_diagnostics.items():
        log.info("%s: %s", key.replace("_", " "), value)
    try:
        with progress:
            history = trainer.train()
        checkpoint = trainer.save()
    except KeyboardInterrupt:
        latest = latest_checkpoint(run_dir)
        where = f"checkpoint {latest}" if latest else "no checkpoint yet: a resume starts over"
        console.print(
            f"[bold yellow]interrupted[/] after step {trainer.step_index}; {where}.\n"
            f"Resume with the same command and hydra.run.dir={run_dir} (train.resume=auto).",
            highlight=False,
            soft_wrap=True,
        )
        trainer.cleanup()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        metrics_file.close()
    summary = {
        "steps": trainer.step_index,
        "wall_s": time.perf_counter() - start,
        "reward_first10": _mean(history[:10], "reward/mean"),
        "reward_last10": _mean(history[-10:], "reward/mean"),
        "final_checkpoint": str(checkpoint),
        **trainer.prompt_budget.summary(),
        **trainer.reward_diagnostics,
    }
    write_summary(run_dir / "summary.json", summary)
    console.print(summary_table(summary, history))
    trainer.cleanup()
    return summary["reward_last10"] if summary["reward_last10"] is not None else float("nan")
