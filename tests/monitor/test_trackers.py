"""TensorBoard through accelerate's tracker, read back as TensorBoard reads it: a real three-step
run logs every finite metric at its step (equal to metrics.jsonl), the reward histograms, the
completions as a markdown table that renders, and the NaN heat map; a resume purges the steps it
runs again; a tracker whose package is missing fails before anything is written."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.text.text_plugin import text_array_to_html
from tensorboard.util import tensor_util

from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.monitor.trackers import completions_table, open_trackers, scalar_metrics
from grpo_cli.training import GRPOTrainer
from tests.conftest import Recorder, read_metrics

FUNCTIONS = ("exact_match", "partial_credit")  # the default config's reward functions


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config as dotted keys, the way the CLI hands it over."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_events(tb_dir: Path) -> ea.EventAccumulator:
    everything = {ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0, ea.TENSORS: 0}
    return ea.EventAccumulator(str(tb_dir), size_guidance=everything).Reload()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StepResult]]:
    run_dir = tmp_path_factory.mktemp("run")
    cfg = TrainConfig()
    cfg.train.steps = 3
    cfg.train.prompts_per_step = 2
    cfg.rollout.num_generations = 4
    cfg.monitor.log_completions_every = 2
    cfg.algo.beta = 0.04  # a reference model, so `kl` is a number
    trackers = open_trackers(["tensorboard"], run_dir, flat(asdict(cfg)), cfg.monitor.log_completions_every)
    metrics, recorder = MetricsFile(run_dir / "metrics.jsonl"), Recorder()
    trainer = GRPOTrainer(cfg, run_dir, [metrics, recorder, trackers])
    try:
        trainer.setup()
        trainer.train()
    finally:
        metrics.close()
        trackers.close()
        trackers.close()  # idempotent: the CLI closes on every exit path
        trainer.cleanup()
    return run_dir, recorder.results


def test_every_finite_metric_is_a_scalar_equal_to_metrics_jsonl(run: tuple[Path, list[StepResult]]) -> None:
    run_dir, _ = run
    events = read_events(run_dir / "tb")
    tags = set(events.Tags()["scalars"])
    assert {"reward/mean", "loss", "kl", *(f"reward/{fn}/mean" for fn in FUNCTIONS)} <= tags
    assert "step" not in tags
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in tags}
    for row in rows:
        for key, value in row.items():
            if key == "step" or isinstance(value, (str, list, dict)) or value is None:
                assert key not in logged or row["step"] not in logged[key], key
                continue
            assert logged[key][row["step"]] == pytest.approx(float(value), rel=1e-6, abs=1e-12), key
    assert tags == {k for row in rows for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def test_reward_histograms_hold_the_finite_rewards(run: tuple[Path, list[StepResult]]) -> None:
    run_dir, results = run
    events = read_events(run_dir / "tb")
    assert {*(f"reward/{fn}" for fn in FUNCTIONS), "reward/fused"} <= set(events.Tags()["histograms"])
    for result in results:
        columns = {**{f"reward/{fn}": result.rewards[fn] for fn in FUNCTIONS}, "reward/fused": result.fused}
        for tag, values in columns.items():
            finite = [v for v in values if v is not None and math.isfinite(v)]
            (histogram,) = [e.histogram_value for e in events.Histograms(tag) if e.step == result.step]
            assert histogram.num == len(finite)
            assert (histogram.min, histogram.max) == pytest.approx((min(finite), max(finite)))


def test_completions_are_a_markdown_table_that_renders(run: tuple[Path, list[StepResult]]) -> None:
    run_dir, results = run
    events = read_events(run_dir / "tb")
    (tag,) = events.Tags()["tensors"]
    assert tag == "completions/text_summary"
    assert [e.step for e in events.Tensors(tag)] == [1, 2]  # the first, then log_completions_every=2 of 3 steps
    text_array = tensor_util.make_ndarray(events.Tensors(tag)[1].tensor_proto)  # step 2's
    text = text_array.item().decode()
    samples = results[1].samples
    assert text == completions_table(samples)
    assert text.splitlines()[0] == "| prompt | completion | exact_match | partial_credit | reward | advantage |"
    for sample in samples:  # the real completions, their pipes escaped and lines joined
        for piece in re.split(r"\r\n|\r|\n", sample["completion"].replace("\\", "\\\\").replace("|", "\\|")):
            assert piece in text
    html = text_array_to_html(text_array, enable_markdown=True)  # what TensorBoard's text tab shows
    assert html.count("<th>") == 6
    assert html.count("<td>") == 1 + 6 * len(samples)  # the plugin's one-cell wrapper, then the rows


def test_the_nan_heat_map_is_an_image_every_completions_step_and_at_the_end(
    run: tuple[Path, list[StepResult]],
) -> None:
    run_dir, _ = run
    events = read_events(run_dir / "tb")
    assert events.Tags()["images"] == ["nan_heatmap"]
    images = events.Images("nan_heatmap")
    assert [image.step for image in images] == [2, 3]
    assert all(image.width > 100 and image.height > 100 for image in images)
    assert images[-1].encoded_image_string.startswith(b"\x89PNG")


def test_the_config_is_logged_as_hparams(run: tuple[Path, list[StepResult]]) -> None:
    run_dir, _ = run
    (hparams,) = (run_dir / "tb").glob("*/hparams.yml")
    values = yaml.safe_load(hparams.read_text())
    assert values["train.steps"] == 3 and values["algo.beta"] == 0.04
    assert [f["name"] for f in json.loads(values["reward.functions"])] == list(FUNCTIONS)  # a list, as JSON


def step_result(step: int, loss: float) -> StepResult:
    return StepResult(step, {"step": step, "loss": loss}, rewards={"f": [loss, math.nan]}, fused=[loss, math.nan])


def test_a_resume_purges_the_steps_it_runs_again(tmp_path: Path) -> None:
    with open_trackers(["tensorboard"], tmp_path, {}, 0) as first:
        for step in (1, 2, 3):
            first.on_step(step_result(step, float(step)))
    time.sleep(1.05 - time.time() % 1)  # event files sort by their whole-second timestamp
    with open_trackers(["tensorboard"], tmp_path, {}, 0, history=[{"step": 1}]) as resumed:
        resumed.on_step(step_result(2, 20.0))
    events = read_events(tmp_path / "tb")
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 20.0)]
    assert [e.step for e in events.Histograms("reward/f")] == [1, 2]
    assert [e.step for e in events.Images("nan_heatmap")] == [2]  # the first run's final map (step 3) is gone


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_a_missing_tracker_package_fails_before_writing_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(
        GrpoError, match=re.escape("monitor.trackers=[wandb]: the wandb package is not installed")
    ) as err:
        open_trackers(["tensorboard", "wandb"], run_dir, {}, 0)
    assert 'pip install "grpo-cli[wandb]"' in str(err.value)
    assert not run_dir.exists()


def test_numbers_only_become_scalars() -> None:
    """Strings (the sandbox backend), lists (NaN indices), None and NaN stay out; bools count."""
    row = {"step": 1, "loss": np.float32(0.5), "n": 3, "ok": False, "backend": "bwrap", "idx": [0], "kl": None}
    assert scalar_metrics({**row, "nan": math.nan}) == {"loss": 0.5, "n": 3, "ok": 0}
    assert json.dumps(scalar_metrics(row))  # plain Python numbers, whatever the metric's type
