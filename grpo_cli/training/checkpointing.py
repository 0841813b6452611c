"""A run's checkpoints as the trainer writes and reads them: weights, tokenizer and every piece of
training state, written once per step even when several processes ask (data-parallel)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_cli.checkpoint import (
    BASE_MODEL_KEY,
    latest_checkpoint,
    load_checkpoint_state,
    resume_point,
    save_checkpoint,
    set_aside_earlier_run,
)
from grpo_cli.config.schema import TrainConfig
from grpo_cli.core.update import Learner
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import truncate_metrics
from grpo_cli.training.distributed import World
from grpo_cli.training.interrupt import sigterm_waits
from grpo_cli.training.resume import check_resume
from grpo_cli.training.sharding import FULL_OPTIMIZER, full_optimizer_state, load_full_optimizer_state, sharded_run
from grpo_cli.training.state import TrainState

log = logging.getLogger("grpo")


@dataclass
class Policy:
    """What a checkpoint's Hugging Face half holds, and where the run started from."""

    model: Any  # the module itself (a LoRA run: the peft model, whose adapter alone is saved)
    tokenizer: Any
    model_dir: Path  # the starting model's directory


def training_state(
    learner: Learner, state: TrainState, moving_reference: bool, optimizer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What from_pretrained does not hold: optimizer, scheduler, fp16 scaler, TrainState, and a
    reference that algo.ref_sync has moved away from the starting model. `optimizer`: a sharded
    run's full state (`sharding.full_optimizer_state`, gathered by every process beforehand)."""
    return {
        "optimizer": optimizer if optimizer is not None else learner.optimizer.state_dict(),
        "optimizer_format": FULL_OPTIMIZER if optimizer is not None else "index",
        "scheduler": learner.scheduler.state_dict(),
        "scaler": learner.scaler.state_dict() if learner.scaler is not None else None,
        "state": state.state_dict(),
        # whole only unsharded: with fsdp this would be the main process's shards, which is why
        # config.train_checks refuses distributed.strategy=fsdp with algo.ref_sync
        "reference": learner.reference.state_dict() if moving_reference else None,
    }


class RunCheckpoints:
    """`RUN/checkpoints/step_N`, written atomically by the main process after every process reached it."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, world: World) -> None:
        self.cfg, self.run_dir, self.world = cfg, run_dir, world
        self.saved_step = -1  # the step last saved (or resumed from): a data-parallel save happens once
        self.sharded = sharded_run(cfg.distributed, world.size)  # optimizer state in shards

    def resume_point(self) -> Path | None:
        """The checkpoint `train.resume` names, its config changes since then logged (an incompatible one
        fails). One of this run directory's own checkpoints with later ones beside it is refused: the
        next plain command would resume from those, over this branch."""
        setting = self.cfg.train.resume
        checkpoint, passed_over = resume_point(setting, self.run_dir)
        for reason in passed_over:  # auto: a newer checkpoint cut short or garbled
            log.warning("resume: %s: resuming from %s instead", reason, checkpoint.name if checkpoint else None)
        newest = latest_checkpoint(self.run_dir)
        if setting not in ("auto", "never") and checkpoint is not None and newest is not None:
            if self._own(checkpoint) and checkpoint.resolve() != newest.resolve():
                raise GrpoError(
                    f"train.resume={setting}: {self.run_dir} holds a later checkpoint ({newest.name}) "
                    "that the next plain command would resume from instead: branch into another hydra.run.dir"
                )
        for change in check_resume(checkpoint, self.cfg) if checkpoint is not None else []:
            log.warning("resume: config changed since the checkpoint: %s", change)
        return checkpoint

    def start(self, checkpoint: Path | None, learner: Learner, state: TrainState) -> tuple[int, list[dict[str, Any]]]:
        """(step, metrics history) to continue from: the checkpoint's, restored into `learner` and
        `state`, or a fresh start's, whose run directory must not keep an older run's metric lines."""
        step = self.restore(checkpoint, learner, state) if checkpoint is not None else 0
        if self.world.is_main:
            self._set_aside_another_run(checkpoint)
        history = truncate_metrics(self.run_dir / "metrics.jsonl", step) if self.world.is_main else []
        return step, history

    def _own(self, checkpoint: Path) -> bool:
        """One of this run directory's checkpoints."""
        return checkpoint.resolve().parent == (self.run_dir / "checkpoints").resolve()

    def _set_aside_another_run(self, checkpoint: Path | None) -> None:
        """A run that does not continue the directory's newest checkpoint (train.resume=never, or a
        PATH elsewhere) moves the earlier run aside, so nothing of it is resumed or mixed in later."""
        newest = latest_checkpoint(self.run_dir)
        if newest is None or (checkpoint is not None and self._own(checkpoint)):
            return  # resuming this directory (its newest readable checkpoint: later ones are refused above)
        aside = set_aside_earlier_run(self.run_dir)
        log.warning(
            "%s holds an earlier run (checkpoints up to %s): this run does not continue it, so it is moved to %s, "
            "whole; delete that to free the space",
            self.run_dir,
            newest.name,
            aside,
        )

    def save(self, step: int, policy: Policy, learner: Learner, state: TrainState) -> Path:
        """Weights (a LoRA run: its adapter only, peft's files) and tokenizer as Hugging Face files;
        optimizer, scheduler and TrainState beside them. A SIGTERM during the write waits for it."""
        with sigterm_waits():
            return self._save(step, policy, learner, state)

    def _save(self, step: int, policy: Policy, learner: Learner, state: TrainState) -> Path:
        directory = self.run_dir / "checkpoints" / f"step_{step:06d}"
        optimizer = None
        if self.world.size > 1:  # every process must take the same branch: decide on what all of them know
            if self.saved_step == step:
                return directory
            self.saved_step = step
            if self.sharded:  # every process gathers its optimizer shards (a collective); the main one writes
                optimizer = full_optimizer_state(learner.model, learner.optimizer)
            if not self.world.is_main:  # every process holds the same weights and state: the main one writes
                self.world.barrier()
                return directory
        elif latest_checkpoint(self.run_dir) == directory:
            return directory  # this step is already saved (save_every, then Ctrl-C or the end)
        trainer_state = {
            "step": step,
            "config": asdict(self.cfg),
            "processes": self.world.size,
            # the starting model: a LoRA checkpoint is an adapter on it (`grpo export` finds it here)
            BASE_MODEL_KEY: str(policy.model_dir.resolve()),
        }
        saved = save_checkpoint(
            directory,
            policy.model,
            policy.tokenizer,
            trainer_state,
            training_state(learner, state, moving_reference=self.cfg.algo.ref_sync.every > 0, optimizer=optimizer),
        )
        self.world.barrier()  # nobody reads or resumes from a checkpoint still being written
        return saved

    def restore(self, directory: Path, learner: Learner, state: TrainState) -> int:
        """Continue exactly where the checkpoint left off (same data order, same RNG): its step."""
        trainer_state, saved = load_checkpoint_state(directory)
        if "state" not in saved:
            raise GrpoError(f"{directory}: written by an older grpo; start over with train.resume=never")
        if saved.get("optimizer_format") == FULL_OPTIMIZER:  # written sharded: any process count takes it
            load_full_optimizer_state(learner.model, learner.optimizer, saved["optimizer"])
        elif self.sharded:
            raise GrpoError(
                f"{directory}: written by an unsharded run; distributed.strategy=fsdp resumes from checkpoints of "
                "fsdp runs only: resume with distributed.strategy=ddp, or start over with train.resume=never"
            )
        else:
            learner.optimizer.load_state_dict(saved["optimizer"])
        learner.scheduler.load_state_dict(saved["scheduler"])
        if learner.scaler is not None and saved.get("scaler"):
            learner.scaler.load_state_dict(saved["scaler"])
        state.load_state_dict(saved["state"])
        if saved.get("reference") is not None and learner.reference is not None:  # algo.ref_sync moved it
            learner.reference.load_state_dict(saved["reference"])
        saved_processes = trainer_state.get("processes", 1)
        if saved_processes != self.world.size:
            log.warning(
                "resume: the checkpoint was written by %d process(es), this run has %d: the global batch, the "
                "prompt order and the update are the same; each process's sampling draws differ",
                saved_processes,
                self.world.size,
            )
        self.saved_step = trainer_state["step"]
        return self.saved_step
