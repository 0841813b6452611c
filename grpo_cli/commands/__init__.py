"""The subcommand table: one record per subcommand, which the dispatcher, `grpo --help`, the
ConfigStore and the Hydra entry point all loop over. A new subcommand is one module and one row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_cli.config.schema import CheckConfig, EvalConfig, ExportConfig, RolloutRunConfig, ScoreConfig, TrainConfig


@dataclass(frozen=True)
class Subcommand:
    name: str  # `grpo NAME`; a Hydra command also has conf/NAME.yaml and the schema NAME_schema
    schema: type | None  # the dataclass its config composes onto; None: a plain argparse command, no Hydra
    help: str  # one line in `grpo --help`
    run: str  # "module:function": (config object, run directory) -> objective; without a schema, (argv) -> None
    locks_run_dir: bool = True  # a run directory of its own: one run at a time in it (commands/run_lock.py)

    @property
    def schema_name(self) -> str:
        return f"{self.name}_schema"

    def load(self) -> Callable[[Any, Path], float] | Callable[[list[str]], None]:
        """Imported only when this subcommand runs: `grpo --help` must not pay for torch."""
        module, function = self.run.split(":")
        return getattr(importlib.import_module(module), function)


SUBCOMMANDS = (
    Subcommand(
        "train", TrainConfig, "GRPO training: rollout, score, advantage, update", "grpo_cli.commands.train:run_train"
    ),
    Subcommand(
        "rollout",
        RolloutRunConfig,
        "sample G completions per prompt of a data set into a rollouts jsonl (resumable)",
        "grpo_cli.commands.rollout:run_rollout",
    ),
    Subcommand(
        "score",
        ScoreConfig,
        "score a rollouts jsonl: per-function rewards, fused reward, advantages",
        "grpo_cli.commands.score:run_score",
        locks_run_dir=False,  # hydra.run.dir is "." and its output a file of the user's choosing
    ),
    Subcommand(
        "eval",
        EvalConfig,
        "held-out accuracy, pass@k and mean rewards of a model (or a rollouts jsonl): eval.json",
        "grpo_cli.commands.eval:run_eval",
    ),
    Subcommand(
        "export",
        ExportConfig,
        "a checkpoint (or a run's newest) as a Hugging Face directory; LoRA merged; verified by reloading",
        "grpo_cli.commands.export:run_export",
        locks_run_dir=False,  # hydra.run.dir is "."
    ),
    Subcommand(
        "check",
        CheckConfig,
        "run the model zoo's equalities on a model: its sampling loop, layout, LoRA and FSDP support, export",
        "grpo_cli.commands.check:run_check",
        locks_run_dir=False,  # hydra.run.dir is ".": writes nothing
    ),
    Subcommand(
        "plot",
        None,
        "draw a run's curves and NaN heatmap, or overlay several runs / a multirun",
        "grpo_cli.commands.plot:main",
    ),
)
BY_NAME = {sub.name: sub for sub in SUBCOMMANDS}
