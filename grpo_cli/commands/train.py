"""`grpo train`: run the GRPO loop on the composed config and write the run directory.

`run_train`, the task function, picks the way in: the memory plan alone, the launcher of N
processes (`commands/launch.py`), or one process of the run; `MainRun` is the main process's run,
from its console and files to the summary. A Ctrl-C or a SIGTERM ends each of them on a saved step
with the command that resumes it (`training/interrupt.py`).
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.monitor.trackers import TrackerObserver, open_trackers, require_trackers
from grpo_cli.stats import column_mean
from grpo_cli.training import GRPOTrainer
from grpo_cli.training.distributed import World, launched_processes
from grpo_cli.training.guards import EXIT_PAUSED, TrainingHalted
from grpo_cli.training.interrupt import exit_code, stopped_by, terminate_as_interrupt
from grpo_cli.training.memory_plan import log_memory_plan, show_memory_plan

log = logging.getLogger("grpo")
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT (`training.interrupt.exit_code`: 143 for SIGTERM)
transformers.utils.logging.disable_progress_bar()  # the console's panel is the one progress display


def _mean(rows: list[dict], key: str) -> float | None:
    value = column_mean(rows, key)
    return None if math.isnan(value) else value


def resume_command(run_dir: Path) -> str:
    """The command line that continues this run: the same overrides, this run directory."""
    overrides = [a for a in sys.argv[1:] if not a.startswith(("hydra.run.dir=", "-m", "--multirun"))]
    return shlex.join(["grpo", "train", *overrides, f"hydra.run.dir={run_dir}"])


def report_interrupt(console: Console, run_dir: Path, interrupt: KeyboardInterrupt, where: str) -> None:
    """Where a Ctrl-C or a SIGTERM left the run, and the command that continues it."""
    latest = latest_checkpoint(run_dir)
    saved = f"checkpoint {latest}" if latest else "no checkpoint yet: a resume starts over"
    how, command = stopped_by(interrupt), resume_command(run_dir)
    console.print(
        f"[bold yellow]{how}[/] {where}; {saved}.\nResume with:\n  {escape(command)}",
        highlight=False,
        soft_wrap=True,
    )
    # the file tells how the run ended; the console has the command on a line of its own to copy
    to_log_files(logging.WARNING, f"{how} {where}; {saved}. Resume with: {command}")


def report_halt(console: Console, halt: TrainingHalted, run_dir: Path) -> None:
    """A stability guard paused or stopped the run on a saved step."""
    console.print(
        f"[bold red]{'paused' if halt.exit_code == EXIT_PAUSED else 'stopped'} by a stability guard[/] "
        f"after step {halt.step}: {escape(str(halt))}.\n"
        f"Checkpoint {halt.checkpoint}. Resume with:\n  {escape(resume_command(run_dir))}",
        highlight=False,
        soft_wrap=True,
    )


def last_eval(history: list[dict]) -> dict[str, float]:
    """The latest `train.eval_every` figures (eval/accuracy, ...), for the summary and sweeps."""
    rows = [row for row in history if any(k.startswith("eval/") for k in row)]
    return {k: v for k, v in rows[-1].items() if k.startswith("eval/")} if rows else {}


def run_train(cfg: TrainConfig, run_dir: Path) -> float:
    """The task function: returns `sweep.objective` from the summary (by default the last 10 steps'
    mean raw reward, reward/raw_mean), the figure sweepers optimise. With distributed.num_processes > 1
    it launches the workers and returns theirs; inside a launch, this process trains its share."""
    if cfg.debug.smoke:
        apply_smoke(cfg)
    require_trackers(cfg.monitor.trackers)
    if cfg.plan:  # the memory plan alone (per process): no weights load, no worker starts, nothing is written
        show_memory_plan(cfg, stderr_console())
        return math.nan
    if cfg.distributed.num_processes > 1 and launched_processes() == 1:
        return _launch(cfg, run_dir)
    world = join_world(cfg, run_dir)
    with terminate_as_interrupt():  # SIGTERM (a cluster's preemption) stops the run as Ctrl-C does
        result = _train_main(cfg, run_dir, world) if world.is_main else _train_quietly(cfg, run_dir, world)
    world.leave()  # only after a finished run: a failed process's partners are stopped by the launcher
    return result


def _launch(cfg: TrainConfig, run_dir: Path) -> float:
    """This process starts the workers and waits for them; a signal it gets, they get too."""
    try:
        return launch_workers(cfg, run_dir)
    except KeyboardInterrupt as interrupt:  # the workers saved the step they finished and stopped
        report_interrupt(stderr_console(), run_dir, interrupt, f"with {cfg.distributed.num_processes} processes")
        sys.exit(exit_code(interrupt))


def _train_main(cfg: TrainConfig, run_dir: Path, world: World) -> float:
    """The main process: every file, log line and tracker is its own."""
    log_memory_plan(cfg, world.device)  # one line before the model loads; a warning when it does not fit
    run = MainRun(cfg, run_dir, world)
    started = time.perf_counter()
    try:
        run.start()
        history, checkpoint, halted = run.train()
        run.close()  # every line written before the summary and the pictures read them
        return run.finish(history, checkpoint, halted, time.perf_counter() - started)
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: the trainer saved the last finished step
        if world.size == 1 or WORKER_ENV not in os.environ:  # a worker's launcher reports it, with its command
            report_interrupt(run.console, run_dir, interrupt, f"after step {run.trainer.step_index}")
        run.trainer.cleanup()
        sys.exit(exit_code(interrupt))
    finally:
        run.close()


class MainRun:
    """The main process's run: the trainer with its console and files, from start-up to the summary."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, world: World) -> None:
        self.cfg, self.run_dir, self.world = cfg, run_dir, world
        self.console = stderr_console()
        monitor = cfg.monitor
        self.progress = TrainingConsole(
            cfg.train.steps,
            monitor.console,
            self.console,
            monitor.print_every,
            monitor.log_completions_every,
            monitor.num_completions_to_print,
        )
        self.metrics_file = MetricsFile(run_dir / "metrics.jsonl")
        self.files: list[Observer] = [
            self.metrics_file,
            CompletionLog(run_dir / "completions", monitor.log_completions_every),
        ]
        self.trainer = GRPOTrainer(cfg, run_dir, [*self.files, self.progress], world)
        self.trainer.report_stage = self.progress.stage  # the heartbeat and the panel say what a step is doing
        self.trackers: TrackerObserver | None = None

    def start(self) -> None:
        """Validate and load (a bad value fails before any model is built), then open the trackers
        and say how the run starts."""
        cfg, trainer = self.cfg, self.trainer
        trainer.setup()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.monitor.trackers:  # opened once a resume is known: their steps continue from it
            self.trackers = open_trackers(
                cfg.monitor.trackers,
                self.run_dir,
                flatten(asdict(cfg)),
                cfg.monitor.log_completions_every,
                trainer.history,
            )
            trainer.observers.insert(len(self.files), self.trackers)
        lr_line = f"effective lr {trainer.lr:g} (optim.lr={cfg.optim.lr:g}, optim.lr_scaling={cfg.optim.lr_scaling})"
        write_resolved_config(cfg, self.run_dir, f"# {lr_line}\n")
        log.info(lr_line)
        if self.world.size > 1:
            per_process = cfg.train.prompts_per_step // self.world.size
            log.info("data-parallel: %d processes, %d prompts each per step", self.world.size, per_process)
        if trainer.resumed_from:
            log.info("resuming from %s (step %d)", trainer.resumed_from, trainer.step_index)
            self.progress.resumed_at(trainer.step_index)
        log.info("run directory: %s", self.run_dir)
        for key, value in trainer.diagnostics.items():
            log.info("%s: %s", key.replace("_", " "), value)

    def train(self) -> tuple[list[dict], Path, TrainingHalted | None]:
        """The loop and the final checkpoint: (history, checkpoint, the guard's halt if one ended it)."""
        try:
            with self.progress:
                history = self.trainer.train()
            return history, self.trainer.save(), None
        except TrainingHalted as halt:  # a guard: the step is finished and saved
            report_halt(self.console, halt, self.run_dir)
            return self.trainer.history, Path(halt.checkpoint), halt

    def close(self) -> None:
        """The metrics file and the trackers; again is a no-op."""
        self.metrics_file.close()
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None

    def finish(self, history: list[dict], checkpoint: Path, halted: TrainingHalted | None, wall_s: float) -> float:
        """summary.json, the pictures and the summary table; a guard's exit code, else the objective."""
        summary = self.summary(history, checkpoint, halted, wall_s)
        write_summary(self.run_dir / "summary.json", summary)
        if self.cfg.monitor.plots and history:
            pictures = draw_run_plots(self.run_dir)
            log.info("pictures: %s (redraw or overlay runs: grpo plot RUN_DIR...)", ", ".join(map(str, pictures)))
        self.console.print(summary_table(summary, history))
        self.trainer.cleanup()
        if halted is not None:
            sys.exit(halted.exit_code)  # pause 75, stop 76: distinct from success, errors and Ctrl-C
        return objective(self.run_dir, self.cfg.sweep.objective)

    def summary(
        self, history: list[dict], checkpoint: Path, halted: TrainingHalted | None, wall_s: float
    ) -> dict[str, Any]:
        trainer = self.trainer
        return {
            "steps": trainer.step_index,
            "wall_s": wall_s,
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
            "processes": self.world.size,
        }


def _train_quietly(cfg: TrainConfig, run_dir: Path, world: World) -> float:
    """A non-main data-parallel process: the same steps, collectives and checkpoint calls as the
    main one, and nothing written or printed."""
    trainer = GRPOTrainer(cfg, run_dir, [], world)
    try:
        trainer.setup()
        trainer.train()
        trainer.save()
    except TrainingHalted as halt:  # the main process prints it and exits with its code
        trainer.cleanup()
        sys.exit(halt.exit_code)
    except KeyboardInterrupt as interrupt:  # the main process (or the launcher) says where the run stopped
        trainer.cleanup()
        sys.exit(exit_code(interrupt))
    trainer.cleanup()
    return math.nan
