"""Every family of the zoo trains with nothing set but the model (issue 53 item 1): two steps of
`grpo train model=hf model.path=DIR` at debug=smoke's sizes, in process, with a finite loss, weights
that move, and a start-up that names the sampling loop and the training layout it chose and why.
Plus one `grpo train` as a user runs it, on the tiny Qwen3.5 (the must-show command)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_cli.config.schema import DebugConfig
from tests.conftest import run_grpo
from tests.zoo.conftest import ZooRuns
from tests.zoo.families import FAMILIES

NAMES = [family.name for family in FAMILIES]


@pytest.mark.parametrize("family", NAMES)
def test_the_family_trains_two_steps_with_only_its_model_set(family: str, zoo_runs: ZooRuns) -> None:
    run = zoo_runs[family]
    if run.error is not None:
        raise run.error
    assert len(run.metrics) == DebugConfig().steps
    for metrics in run.metrics:
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]), metrics
        assert metrics["skipped_updates"] == 0
    assert run.moved, "two steps left every weight as it was"


@pytest.mark.parametrize("family", NAMES)
def test_the_start_up_names_the_loop_and_the_layout_it_chose_and_why(family: str, zoo_runs: ZooRuns) -> None:
    run = zoo_runs[family]
    if run.error is not None:
        raise run.error
    loop, layout = run.diagnostics["rollout_loop"], run.diagnostics["train_layout"]
    # the fast loop, or generate with the reason the fast one cannot drive this model
    # (the fixed-shape decode where the family's layers allow it, else through the model's forward, saying why)
    fast = loop == "fast, fixed-shape decode" or (
        loop.startswith("fast, through the model's forward (") and loop[-1] == ")"
    )
    assert fast or (loop.startswith("generate (") and loop.endswith(")")), loop
    # packed where it is offered (auto packs where it costs less), or padded with the reason
    assert layout.startswith("auto: packed") or (layout.startswith("padded (") and layout.endswith(")")), layout


def test_grpo_train_on_the_tiny_qwen3_5_trains_and_says_which_loop_and_layout(
    zoo_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The issue's must-show: `grpo train model=hf model.path=<tiny Qwen3.5>`, only shrunk to two steps."""
    d = DebugConfig()
    result = run_grpo(
        "train",
        "model=hf",
        f"model.path={zoo_dirs['qwen3_5_text']}",
        f"train.steps={d.steps}",
        f"train.prompts_per_step={d.prompts_per_step}",
        f"rollout.num_generations={d.num_generations}",
        f"rollout.max_new_tokens={d.max_new_tokens}",
        f"data.max_examples={d.max_examples}",
        "monitor.plots=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    lines = result.stderr.splitlines()
    loop = [line.split("rollout loop: ", 1)[1] for line in lines if "rollout loop: " in line]
    assert loop and (loop[0].startswith("fast") or loop[0].startswith("generate (")), result.stderr[-3000:]
    # Qwen3.5's linear-attention layers carry a state from token to token: never packed, and it says so
    assert any("train layout: padded (" in line and "linear_attention" in line for line in lines), result.stderr[-3000:]
