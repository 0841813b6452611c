"""`grpo train`: run the GRPO loop on the composed config and write the run directory."""

from __future__ import annotations

import logging
import math
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import transformers
from omegaconf import OmegaConf
from rich.console import Console
from rich.markup import escape

from grpo_cli.config import TrainConfig, apply_smoke
from grpo_cli.config.validate import flatten
from grpo_cli.core.checkpoint import latest_checkpoint
from grpo_cli.monitor import (
    CompletionLog,
    MetricsFile,
    Observer,
    TrainingConsole,
    reward_function_names,
    summary_table,
    write_summary,
)
from grpo_cli.monitor.plots import draw_run_plots
from grpo_cli.monitor.trackers import TrackerObserver, open_trackers, require_trackers
from grpo_cli.stats import column_mean
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.guards import EXIT_PAUSED, TrainingHalted

log = logging.getLogger("grpo")
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT
transformers.utils.logging.disable_progress_bar()  # the console's panel is the one progress display


def _mean(rows: list[dict], key: str) -> float | None:
    value = column_mean(rows, key)
    return None if math.isnan(value) else value


def resume_command(run_dir: Path) -> str:
    """The command line that continues this run: the same overrides, this run directory."""
    overrides = [a for a in sys.argv[1:] if not a.startswith(("hydra.run.dir=", "-m", "--multirun"))]
    return shlex.join(["grpo", "train", *overrides, f"hydra.run.dir={run_dir}"])


def run_train(cfg: TrainConfig, run_dir: Path) -> float:
    """The task function: returns the last-10-steps mean reward, the objective sweepers use."""
    if cfg.debug.smoke:
        apply_smoke(cfg)
    require_trackers(cfg.monitor.trackers)
    console = Console(stderr=True)
    metrics_file = MetricsFile(run_dir / "metrics.jsonl")
    monitor = cfg.monitor
    progress = TrainingConsole(
        cfg.train.steps,
        monitor.console,
        console,
        monitor.print_every,
        monitor.log_completions_every,
        monitor.num_completions_to_print,
    )
    observers: list[Observer] = [metrics_file, CompletionLog(run_dir / "completions", monitor.log_completions_every)]
    trainer = GRPOTrainer(cfg, run_dir, [*observers, progress])
    start = time.perf_counter()
    trainer.setup()  # validates first: a bad value fails before any model is built
    run_dir.mkdir(parents=True, exist_ok=True)
    trackers: TrackerObserver | None = None
    if monitor.trackers:  # opened once a resume is known: their steps continue from it
        trackers = open_trackers(
            monitor.trackers, run_dir, flatten(asdict(cfg)), monitor.log_completions_every, trainer.history
        )
        trainer.observers.insert(len(observers), trackers)
    lr_line = f"effective lr {trainer.lr:g} (optim.lr={cfg.optim.lr:g}, optim.lr_scaling={cfg.optim.lr_scaling})"
    resolved = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    (run_dir / "config.yaml").write_text(f"# {lr_line}\n{resolved}", encoding="utf-8")
    log.info(lr_line)
    if trainer.resumed_from:
        log.info("resuming from %s (step %d)", trainer.resumed_from, trainer.step_index)
    log.info("run directory: %s", run_dir)
    for key, value in trainer.diagnostics.items():
        log.info("%s: %s", key.replace("_", " "), value)
    halted: TrainingHalted | None = None
    try:
        with progress:
            history = trainer.train()
        checkpoint = trainer.save()
    except TrainingHalted as halt:  # a guard: the step is finished and saved
        halted, history, checkpoint = halt, trainer.history, Path(halt.checkpoint)
        console.print(
            f"[bold red]{'paused' if halt.exit_code == EXIT_PAUSED else 'stopped'} by a stability guard[/] "
            f"after step {halt.step}: {escape(str(halt))}.\n"
            f"Checkpoint {halt.checkpoint}. Resume with:\n  {escape(resume_command(run_dir))}",
            highlight=False,
            soft_wrap=True,
        )
    except KeyboardInterrupt:
        latest = latest_checkpoint(run_dir)
        where = f"checkpoint {latest}" if latest else "no checkpoint yet: a resume starts over"
        console.print(
            f"[bold yellow]interrupted[/] after step {trainer.step_index}; {where}.\n"
            f"Resume with:\n  {escape(resume_command(run_dir))}",
            highlight=False,
            soft_wrap=True,
        )
        trainer.cleanup()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        metrics_file.close()
        if trackers is not None:
            trackers.close()
    summary = {
        "steps": trainer.step_index,
        "wall_s": time.perf_counter() - start,
        "reward_first10": _mean(history[:10], "reward/mean"),
        "reward_last10": _mean(history[-10:], "reward/mean"),
        **{  # each reward function's raw mean over the last 10 steps, e.g. last10/exact_match
            f"last10/{name}": _mean(history[-10:], f"reward/{name}/mean")
            for name in reward_function_names(history[-1] if history else {})
        },
        "final_checkpoint": str(checkpoint),
        "halted_by_guard": None if halted is None else f"{halted.verdict.action}: {halted}",
        **trainer.prompt_budget.summary(),
        **trainer.diagnostics,
    }
    write_summary(run_dir / "summary.json", summary)
    if monitor.plots and history:
        pictures = draw_run_plots(run_dir)
        log.info("pictures: %s (redraw or overlay runs: grpo plot RUN_DIR...)", ", ".join(map(str, pictures)))
    console.print(summary_table(summary, history))
    trainer.cleanup()
    if halted is not None:
        sys.exit(halted.exit_code)  # pause 75, stop 76: distinct from success, errors and Ctrl-C
    return summary["reward_last10"] if summary["reward_last10"] is not None else float("nan")
