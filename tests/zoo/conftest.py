"""The zoo's shared fixtures: every family of tests/zoo/families.py built once per session (`zoo_dirs`),
and trained once for two steps the way `grpo train model=hf model.path=DIR` trains it (`zoo_runs`), so
each zoo test (training, export, LoRA, FSDP, the support matrix) reads the same models."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_cli.config.schema import TrainConfig
from grpo_cli.training import GRPOTrainer
from tests.training.test_curriculum import composed
from tests.zoo.families import FAMILIES, build


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Family name (transformers' model_type) -> the directory of its tiny random-init model and the
    byte tokenizer. Built once (about 30 ms a family); tests must not write into them."""
    root = tmp_path_factory.mktemp("zoo")
    return {family.name: build(family, root / family.name) for family in FAMILIES}


@dataclass
class ZooRun:
    """One family's two training steps, or the error they stopped on (each test of the family re-raises it)."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # the start-up lines: rollout loop, train layout
    moved: list[str] = field(default_factory=list)  # the parameters the two steps changed
    model: torch.nn.Module | None = None  # the trained policy, in memory
    checkpoint: Path | None = None  # its final checkpoint, as `grpo train` saves it
    error: BaseException | None = None


@functools.cache
def _composed_hf() -> TrainConfig:
    """`grpo train model=hf model.path=DIR`, composed once (Hydra takes most of a second a call)."""
    return composed("model=hf", "model.path=DIR")


def smoke_sized(directory: Path) -> TrainConfig:
    """`grpo train model=hf model.path=DIRECTORY` with nothing else set but the sizes debug=smoke uses
    (DebugConfig's: steps, prompts, completions, tokens); smoke mode itself would swap in the tiny model."""
    cfg = copy.deepcopy(_composed_hf())
    cfg.model.path = str(directory)
    d = cfg.debug
    cfg.train.steps, cfg.train.prompts_per_step, cfg.data.max_examples = d.steps, d.prompts_per_step, d.max_examples
    cfg.rollout.num_generations, cfg.rollout.max_new_tokens = d.num_generations, d.max_new_tokens
    cfg.train.device = "cpu"
    # one thread, as the trainer gives the tiny model: torch's pool on these 64-wide matrices made a step
    # 10x slower on a shared 2-core machine (4.4 s against 0.28 s for Granite 4)
    cfg.train.threads = 1
    return cfg


def train_two_steps(directory: Path, run_dir: Path) -> ZooRun:
    """The trainer `grpo train` runs, in process: set up, two steps, the final checkpoint."""
    run = ZooRun()
    trainer = GRPOTrainer(smoke_sized(directory), run_dir)
    try:
        trainer.setup()
        run.diagnostics = dict(trainer.diagnostics)
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        run.metrics = [trainer.step().metrics for _ in range(trainer.cfg.train.steps)]
        run.moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
        run.checkpoint, run.model = trainer.save(), trainer.model
    except Exception as err:  # kept for the family's tests: one family's failure is not another's
        run.error = err
    finally:
        trainer.cleanup()
    return run


class ZooRuns:
    """Family name -> its two training steps, trained on first use (about a second a family on one
    core), so a test selecting one family (-k) trains only that one."""

    def __init__(self, dirs: dict[str, Path], root: Path) -> None:
        self.dirs, self.root, self.runs = dirs, root, {}

    def __getitem__(self, name: str) -> ZooRun:
        if name not in self.runs:
            self.runs[name] = train_two_steps(self.dirs[name], self.root / name)
        return self.runs[name]


@pytest.fixture(scope="session")
def zoo_runs(zoo_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> ZooRuns:
    return ZooRuns(zoo_dirs, tmp_path_factory.mktemp("zoo_runs"))
