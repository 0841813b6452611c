"""`grpo train`: run the GRPO loop on the composed config and write the run directory."""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import transformers
from rich.console import Console
from rich.markup import escape

from grpo_cli.checkpoint import latest_checkpoint
from grpo_cli.commands.launch import WORKER_ENV, join_world, launch_workers, objective, write_resolved_config
from grpo_cli.config import TrainConfig
from grpo_cli.config.dotted import flatten
from grpo_cli.config.smoke import apply_smoke
from grpo_cli.monitor import (
    CompletionLog,
    MetricsFile,
    Observer,
    TrainingConsole,
    reward_function_names,
    summary_table,
    write_summary,
)
from grpo_cli.monitor.console import to_log_files
from grpo_cli.monitor.plots import draw_run_plots
from grpo_cli.monitor.trackers import TrackerObserver, open_trackers, require_trackers
from grpo_cli.stats import column_mean
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.distributed import World, launched_processes
from grpo_cli.training.guards import EXIT_PAUSED, TrainingHalted
from grpo_cli.training.memory_plan import log_memory_plan, show_memory_plan

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


def report_interrupt(console: Console, run_dir: Path, when: str) -> None:
    """Where a Ctrl-C left the run, and the command that continues it."""
    latest = latest_checkpoint(run_dir)
    where = f"checkpoint {latest}" if latest else "no checkpoint yet: a resume starts over"
    command = resume_command(run_dir)
    console.print(
        f"[bold yellow]interrupted[/] {when}; {where}.\nResume with:\n  {escape(command)}",
        highlight=False,
        soft_wrap=True,
    )
    # the file tells how the run ended; the console has the command on a line of its own to copy
    to_log_files(logging.WARNING, f"interrupted {when}; {where}. Resume with: {command}")


def last_eval(history: list[dict]) -> dict[str, float]:
    """The latest `train.eval_every` figures (eval/accuracy, ...), for the summary and sweeps."""
    rows = [row for row in history if any(k.startswith("eval/") for k in row)]
    return {k: v for k, v in rows[-1].items() if k.startswith("eval/")} if rows else {}


def run_train(cfg: TrainConfig, run_dir: Path) -> float:
    """The task function: returns `sweep.objective` from the summary (by default the last 10 steps'
    mean raw reward, reward/raw_mean), the figure sweepers optimise. With distributed.num_processes > 1 it launches the
    workers and returns theirs; inside a launch, this process trains its share."""
    if cfg.debug.smoke:
        apply_smoke(cfg)
    require_trackers(cfg.monitor.trackers)
    if cfg.plan:  # the memory plan alone (per process): no weights load, no worker starts, nothing is written
        show_memory_plan(cfg, Console(stderr=True))
        return math.nan
    if cfg.distributed.num_processes > 1 and launched_processes() == 1:
        try:
            return launch_workers(cfg, run_dir)
        except KeyboardInterrupt:  # the workers got the signal too and stopped
            report_interrupt(Console(stderr=True), run_dir, f"with {cfg.distributed.num_processes} processes")
            sys.exit(EXIT_INTERRUPTED)
    world = join_world(cfg, run_dir)
    if not world.is_main:  # every file, log line and tracker is the main process's
        return _train_quietly(cfg, run_dir, world)
    console = Console(stderr=True)
    log_memory_plan(cfg, world.device)  # one line before the model loads; a warning when it does not fit
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
    trainer = GRPOTrainer(cfg, run_dir, [*observers, progress], world)
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
    write_resolved_config(cfg, run_dir, f"# {lr_line}\n")
    log.info(lr_line)
    if world.size > 1:
        log.info(
            "data-parallel: %d processes, %d prompts each per step",
            world.size,
            cfg.train.prompts_per_step // world.size,
        )
    if trainer.resumed_from:
        log.info("resuming from %s (step %d)", trainer.resumed_from, trainer.step_index)
        progress.resumed_at(trainer.step_index)
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
        if world.size == 1 or WORKER_ENV not in os.environ:  # a worker's launcher reports it, with its command
            report_interrupt(console, run_dir, f"after step {trainer.step_index}")
        trainer.cleanup()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        metrics_file.close()
        if trackers is not None:
            trackers.close()
    summary = {
        "steps": trainer.step_index,
        "wall_s": time.perf_counter() - start,
        # the raw reward (reward/raw_mean), not the fused one: a zscore or normalize_then_sum fusion
        # centres every batch near 0, and the default sweep objective would say nothing
        "reward_first10": _mean(history[:10], "reward/raw_mean"),
        "reward_last10": _mean(history[-10:], "reward/raw_mean"),
        **{  # each reward function's raw mean over the last 10 steps, e.g. last10/exact_match
            f"last10/{name}": _mean(history[-10:], f"reward/{name}/mean")
            for name in reward_function_names(history[-1] if history else {})
        },
        "final_checkpoint": str(checkpoint),
        "halted_by_guard": None if halted is None else f"{halted.verdict.action}: {halted}",
        **last_eval(history),
        **trainer.prompt_budget.summary(),
        **trainer.diagnostics,
        "processes": world.size,
    }
    write_summary(run_dir / "summary.json", summary)
    if monitor.plots and history:
        pictures = draw_run_plots(run_dir)
        log.info("pictures: %s (redraw or overlay runs: grpo plot RUN_DIR...)", ", ".join(map(str, pictures)))
    console.print(summary_table(summary, history))
    trainer.cleanup()
    if halted is not None:
        sys.exit(halted.exit_code)  # pause 75, stop 76: distinct from success, errors and Ctrl-C
    return objective(run_dir, cfg.sweep.objective)


def _train_quietly(cfg: TrainConfig, run_dir: Path, world: World) -> float:
    """A non-main data-parallel process: the same steps, collectives and checkpoint calls as the
    main one, and nothing written or printed."""
    trainer = GRPOTrainer(cfg, run_dir, [], world)
    trainer.setup()
    try:
        trainer.train()
        trainer.save()
    except TrainingHalted as halt:  # the main process prints it and exits with its code
        trainer.cleanup()
        sys.exit(halt.exit_code)
    except KeyboardInterrupt:  # the main process says where the run stopped
        trainer.cleanup()
        sys.exit(EXIT_INTERRUPTED)
    trainer.cleanup()
    return math.nan
