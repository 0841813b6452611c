"""`monitor.trackers`: each finished step sent to experiment trackers through accelerate's tracker
classes (no `Accelerator`: the trainer is one process and drives the trackers itself).

What each tracker gets:

| tracker     | scalars | reward histograms        | completions table | NaN heat map                 |
|-------------|---------|--------------------------|-------------------|------------------------------|
| tensorboard | yes     | yes (`add_histogram`)    | yes (`add_text`)  | yes (image, `add_images`)    |
| wandb       | yes     | yes (`wandb.Histogram`)  | yes (a string)    | yes (image, `log_images`)    |
| mlflow      | yes     | no                       | no (numbers only) | yes (PNG artifact per step)  |
| aim         | yes     | yes (`aim.Distribution`) | yes (`aim.Text`)  | yes (image, `log_images`)    |

Tags: every finite number of the metrics row under its metrics.jsonl name (`step` is the x-axis,
strings and lists are left out), histograms `reward/<fn>` and `reward/fused` (finite values only),
`completions` (a markdown table, the first step and every `completions_every` steps) and
`nan_heatmap` (every `completions_every` steps and at the end of the run).

Where they write: TensorBoard to `<run_dir>/tb`, aim to a repository in `<run_dir>`, wandb to the
project `grpo` (files under `<run_dir>/wandb`), mlflow to the experiment `grpo` wherever
MLFLOW_TRACKING_URI points (./mlruns by default). Runs are named after the run directory.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from accelerate.state import PartialState
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker
from accelerate.utils import is_aim_available, is_mlflow_available, is_tensorboard_available, is_wandb_available

from grpo_cli.errors import GrpoError
from grpo_cli.monitor.observer import StepResult, completions_due

AVAILABLE: dict[str, Callable[[], bool]] = {
    "tensorboard": is_tensorboard_available,
    "wandb": is_wandb_available,
    "mlflow": is_mlflow_available,
    "aim": is_aim_available,
}
PROJECT = "grpo"  # the wandb project and mlflow experiment every run goes to
COMPLETIONS_TAG = "completions"
HEATMAP_TAG = "nan_heatmap"


def open_trackers(
    names: list[str],
    run_dir: Path,
    hparams: dict[str, Any],
    completions_every: int,
    history: list[dict[str, Any]] | None = None,
) -> TrackerObserver:
    """Start the named trackers and log the config. `history` holds the metrics rows of a resumed
    run's finished steps: the heat map covers them, and TensorBoard drops its events past the last
    one (those steps run again)."""
    names = list(dict.fromkeys(names))
    require_trackers(names)  # every package checked before any tracker writes a file
    start_step = history[-1]["step"] if history else 0
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    observer = TrackerObserver([], completions_every, history)
    # The tracker classes log through accelerate's logger, which needs its process state; cpu=True:
    # this state only answers "main process?", it must not claim a GPU (a no-op if one exists).
    PartialState(cpu=True)
    try:
        for name in names:
            tracker = _build(name, run_dir, start_step)
            tracker.start()
            observer.trackers.append(tracker)
            tracker.store_init_configuration(_hparam_values(hparams))
    except BaseException:
        observer.close()  # the trackers already started are finished, not left open
        raise
    return observer


def require_trackers(names: list[str]) -> None:
    """A missing tracker package fails at once, naming the extra: `grpo train` calls this before
    any model loads, not after minutes of setup."""
    for name in names:
        if name not in AVAILABLE:
            raise GrpoError(f"monitor.trackers=[{name}]: unknown tracker; choose from {', '.join(AVAILABLE)}")
        if not AVAILABLE[name]():
            raise GrpoError(
                f'monitor.trackers=[{name}]: the {name} package is not installed; pip install "grpo-cli[{name}]"'
            )


class TrackerObserver:
    """Logs each finished step to every tracker and flushes, so a crash keeps every finished step."""

    def __init__(self, trackers: list[GeneralTracker], completions_every: int, rows: list[dict] | None = None) -> None:
        self.trackers = trackers
        self.completions_every = completions_every
        self._rows: list[dict[str, Any]] = list(rows or [])  # metrics rows so far: the heat map's data
        self._last_step: int | None = None
        self._heatmap_step: int | None = None
        self._closed = False

    def on_step(self, result: StepResult) -> None:
        step = result.step
        self._rows.append(dict(result.metrics))
        self._last_step = step
        if not self.trackers:
            return
        scalars = scalar_metrics(result.metrics)
        histograms = reward_histograms(result.rewards, result.fused)
        due = bool(self.completions_every) and step % self.completions_every == 0
        logged = completions_due(step, self.completions_every) and result.samples  # as completions/step_N.jsonl
        text = completions_table(result.samples) if logged else None
        for tracker in self.trackers:
            tracker.log(scalars, step=step)
            _log_histograms(tracker, histograms, step)
            if text is not None:
                _log_text(tracker, COMPLETIONS_TAG, text, step)
        if due:
            self._log_heatmap(step)
        self._flush()

    def close(self) -> None:
        """The final heat map, then every tracker finished (each one, even if another fails)."""
        if self._closed:
            return
        self._closed = True
        with ExitStack() as finishing:
            for tracker in self.trackers:
                finishing.callback(tracker.finish)
            if self.trackers and self._last_step is not None and self._heatmap_step != self._last_step:
                self._log_heatmap(self._last_step)
                self._flush()

    def __enter__(self) -> TrackerObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log_heatmap(self, step: int) -> None:
        from grpo_cli.monitor.plots import nan_heatmap_figure  # matplotlib only once a heat map is drawn

        figure = nan_heatmap_figure(self._rows)
        rgb = figure_rgb(figure)
        for tracker in self.trackers:
            _log_image(tracker, HEATMAP_TAG, rgb, figure, step)
        self._heatmap_step = step

    def _flush(self) -> None:
        for tracker in self.trackers:
            if tracker.name == "tensorboard":  # the others send as they log
                tracker.tracker.flush()


# ---- what is logged --------------------------------------------------------------------------
def scalar_metrics(metrics: dict[str, Any]) -> dict[str, int | float]:
    """The finite numbers of a metrics row (bools as 0/1); `step` is the x-axis, not a curve.

    >>> scalar_metrics({"step": 3, "loss": 0.5, "kl": float("nan"), "ok": True, "backend": "bwrap", "idx": [1]})
    {'loss': 0.5, 'ok': 1}
    """
    scalars: dict[str, int | float] = {}
    for key, value in metrics.items():
        if key == "step" or not isinstance(value, numbers.Real):
            continue
        if isinstance(value, numbers.Integral):  # bool included
            scalars[key] = int(value)
        elif math.isfinite(value):
            scalars[key] = float(value)
    return scalars


def reward_histograms(rewards: dict[str, list[float]], fused: list[float]) -> dict[str, np.ndarray]:
    """Each function's finite rewards as `reward/<fn>`, the fused reward as `reward/fused`; a
    function that gave no reward this step has no histogram (an empty one cannot be drawn)."""
    columns = {**{f"reward/{name}": values for name, values in rewards.items()}, "reward/fused": fused}
    histograms = {}
    for tag, values in columns.items():
        array = np.asarray(values, dtype=np.float64)  # None -> NaN
        array = array[np.isfinite(array)]
        if array.size:
            histograms[tag] = array
    return histograms


def completions_table(samples: list[dict[str, Any]]) -> str:
    """The sampled completions as a markdown table, one row each.

    >>> print(completions_table([{"prompt": "1+1=", "completion": "2|\\n3", "rewards": {"exact": 1.0},
    ...                           "reward": 1.0, "advantage": float("nan")}]))
    | prompt | completion | exact | reward | advantage |
    |---|---|---|---|---|
    | 1+1= | 2\\|<br>3 | 1 | 1 | nan |
    """
    names = list(dict.fromkeys(name for sample in samples for name in sample.get("rewards", {})))
    header = ["prompt", "completion", *names, "reward", "advantage"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for sample in samples:
        cells = [
            _markdown_cell(str(sample.get("prompt", ""))),
            _markdown_cell(str(sample.get("completion", ""))),
            *(_number_cell(sample.get("rewards", {}).get(name)) for name in names),
            _number_cell(sample.get("reward")),
            _number_cell(sample.get("advantage")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _markdown_cell(text: str) -> str:
    """A pipe would end the cell and a newline the row: escape one, turn the other into <br>. A
    backslash is escaped first, or one before a pipe would cancel the pipe's escape."""
    for plain, escaped in (("\\", "\\\\"), ("|", "\\|"), ("\r\n", "<br>"), ("\n", "<br>"), ("\r", "<br>")):
        text = text.replace(plain, escaped)  # in this order: each must not undo the one before
    return text


def _number_cell(value: Any) -> str:
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        return "nan"  # the function gave no reward (or the completion was unscorable)
    return f"{value:.3g}"


def figure_rgb(figure: Any) -> np.ndarray:
    """A matplotlib figure as an (H, W, 3) uint8 array, drawn by Agg whatever the backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


# ---- each tracker's API ----------------------------------------------------------------------
def _build(name: str, run_dir: Path, start_step: int) -> GeneralTracker:
    tracker_class = LOGGER_TYPE_TO_CLASS[name]
    if name == "tensorboard":
        # Events land in logging_dir/run_name = run_dir/tb. On resume the writer purges the events
        # of the steps that run again (every step >= purge_step).
        resumed = {"purge_step": start_step + 1} if start_step > 0 else {}
        return tracker_class("tb", logging_dir=str(run_dir), **resumed)
    if name == "wandb":
        return tracker_class(PROJECT, name=run_dir.name, dir=str(run_dir))
    if name == "mlflow":
        return tracker_class(experiment_name=PROJECT, run_name=run_dir.name)
    return tracker_class(run_dir.name, logging_dir=str(run_dir))  # aim: the repository in the run directory


def _log_histograms(tracker: GeneralTracker, histograms: dict[str, np.ndarray], step: int) -> None:
    if not histograms:
        return
    if tracker.name == "tensorboard":
        for tag, values in histograms.items():
            tracker.tracker.add_histogram(tag, values, global_step=step)
    elif tracker.name == "wandb":
        import wandb

        tracker.log({tag: wandb.Histogram(values) for tag, values in histograms.items()}, step=step)
    elif tracker.name == "aim":
        import aim

        tracker.log({tag: aim.Distribution(values) for tag, values in histograms.items()}, step=step)
    # mlflow: no histograms


def _log_text(tracker: GeneralTracker, tag: str, text: str, step: int) -> None:
    if tracker.name in ("tensorboard", "wandb"):
        tracker.log({tag: text}, step=step)
    elif tracker.name == "aim":
        import aim

        tracker.log({tag: aim.Text(text)}, step=step)
    # mlflow: its log keeps numbers only


def _log_image(tracker: GeneralTracker, tag: str, rgb: np.ndarray, figure: Any, step: int) -> None:
    if tracker.name == "tensorboard":
        tracker.log_images({tag: rgb[None]}, step=step, dataformats="NHWC")
    elif tracker.name == "wandb":
        tracker.log_images({tag: [rgb]}, step=step)
    elif tracker.name == "aim":
        tracker.log_images({tag: rgb}, step=step)
    elif tracker.name == "mlflow":
        tracker.log_figure(figure, f"{tag}/step_{step:06d}.png")  # an artifact: mlflow has no image series


def _hparam_values(hparams: dict[str, Any]) -> dict[str, Any]:
    """TensorBoard's hparams take bool, str, int, float or None: anything else becomes its JSON text."""
    return {
        key: value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)
        for key, value in hparams.items()
    }
