"""Pictures of a run from its metrics.jsonl: the training curves and which reward functions failed
when, for one run, several runs or a multirun sweep.

Only `matplotlib.figure.Figure`, never pyplot: no global figure registry to leak from a long
training process, no GUI backend to pick on a headless node; `Figure.savefig` renders with Agg.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import yaml
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from grpo_cli.errors import GrpoError
from grpo_cli.monitor.files import METRICS, read_metrics_rows

SMOOTH_FRACTION = 0.05  # moving-average window as a share of a series' points
FEW_POINTS = 30  # up to this many points a series is drawn with markers and not smoothed
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))

# (title, y label, series): each series is a key pattern (re.fullmatch) and its legend label, which
# may name the pattern's groups. Within a panel, series keep this order, matched keys sorted.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", "mean reward", (("reward/mean", "fused"), (r"reward/(?P<fn>[^/]+)/mean", "{fn}"))),
    ("eval reward", "mean reward", (("eval/reward/mean", "fused"), (r"eval/reward/(?P<fn>[^/]+)/mean", "{fn}"))),
    ("reward weights", "effective weight", ((r"weight/(?P<fn>[^/]+)", "{fn}"),)),
    ("KL to the reference", "KL", (("kl", "kl"),)),
    ("clip epsilons", "epsilon", (("clip/epsilon_low", "low"), ("clip/epsilon_high", "high"))),
    ("entropy", "mean token entropy", (("entropy", "entropy"),)),
    ("completion length", "tokens (mean)", (("completion_len/mean", "mean"),)),
    (
        "diversity",
        "fraction",
        (
            ("diversity/distinct2_group", "distinct-2, group"),
            ("diversity/distinct2_batch", "distinct-2, batch"),
            ("diversity/frac_identical_groups", "identical groups"),
        ),
    ),
    ("repetition", "rate", (("repetition/rate", "rate"),)),
)
NAN_FRAC = re.compile(r"reward/(?P<fn>[^/]+)/nan_frac")
MAX_SWITCHES = 12  # more weight switches than this (a linear curriculum moves them every step): none drawn


def weight_switches(rows: list[dict]) -> list[int]:
    """Steps whose reward weights differ from the step before: where a curriculum's phase starts
    (or failure isolation moved a masked function's weight), the moments a reward curve may jump
    for reasons of its own."""
    keys = sorted({key for row in rows for key in row if key.startswith("weight/")})
    switches, previous = [], None
    for row in rows:
        current = tuple(row.get(key) for key in keys)
        if previous is not None and current != previous and "step" in row:
            switches.append(int(row["step"]))
        previous = current
    return switches if len(switches) <= MAX_SWITCHES else []


def _number(value: object) -> float:
    """JSON null (what MetricsFile writes for NaN) and anything that is not a number are NaN."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Only rows that hold the key: eval figures appear every few steps and must join up."""
    points = [(row.get("step", i), _number(row[key])) for i, row in enumerate(rows) if key in row]
    steps, values = zip(*points) if points else ((), ())
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def smooth(values: np.ndarray) -> np.ndarray:
    """Centered moving average over ~5% of the points, NaN-aware. Centered rather than an EMA so a
    jump is drawn at the step it happened, not trailing after it; the window shrinks at the ends.

    >>> step = np.array([0.0] * 20 + [1.0] * 20)  # 40 points: a window of 3
    >>> smooth(step)[18:22].round(2).tolist()
    [0.0, 0.33, 0.67, 1.0]
    >>> smooth(np.array([1.0, np.nan, 3.0] + [0.0] * 37))[:2].tolist()  # NaN left out, not zero
    [1.0, 2.0]
    """
    half = round(len(values) * SMOOTH_FRACTION / 2)
    if half == 0:
        return values
    kernel = np.ones(2 * half + 1)
    known = np.isfinite(values)
    total = np.convolve(np.where(known, values, 0.0), kernel, mode="same")
    count = np.convolve(known.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _panel_keys(series: tuple[tuple[str, str], ...], keys: list[str]) -> dict[str, str]:
    """key -> legend label, in the panel's series order."""
    found = {}
    for pattern, label in series:
        for key in sorted(keys):
            if match := re.fullmatch(pattern, key):
                found.setdefault(key, label.format(**match.groupdict()))
    return found


def _draw_panel(ax: Axes, runs: list[tuple[str, list[dict]]], title: str, series: tuple, palette: dict) -> None:
    keys = _panel_keys(series, list(dict.fromkeys(k for _, rows in runs for row in rows for k in row)))
    several = len(runs) > 1
    drawn: dict[str, tuple[str, object]] = {}  # series label -> (colour, line style), for the legend
    for r, (_, rows) in enumerate(runs):
        for s, (key, label) in enumerate(keys.items()):
            steps, values = _series(rows, key)
            if not np.isfinite(values).any():
                continue  # absent, or null throughout (KL with beta=0)
            # several runs: one colour per run across panels, series told apart by line style;
            # one run: a colour per series label, the same in every panel (exact_match in reward,
            # eval and weights alike)
            if several:
                color, style = f"C{r % 10}", LINESTYLES[s % len(LINESTYLES)]
            else:
                color, style = palette.setdefault(label, f"C{len(palette) % 10}"), "-"
            if len(values) <= FEW_POINTS:
                ax.plot(steps, values, color=color, linestyle=style, marker="o", markersize=3, linewidth=1.2)
            else:
                ax.plot(steps, values, color=color, linestyle=style, linewidth=0.7, alpha=0.25)
                ax.plot(steps, smooth(values), color=color, linestyle=style, linewidth=1.5)
            drawn[label] = (color, style)
    ax.set_title(title)
    if not drawn:
        note = "no data (null in every row)" if keys else "no data"
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="0.45")
        return
    if len(drawn) > 1:
        handles = [
            Line2D([], [], color="0.3" if several else color, linestyle=style, label=label)
            for label, (color, style) in drawn.items()
        ]
        # above the data, never on it: raise the top of the y range by the legend's rows
        # as many columns as fit the panel's width (about 7 px a character, 40 px for the line)
        ncols = min(len(handles), 3, max(1, 400 // (40 + 7 * max(map(len, drawn)))))
        rows = -(-len(handles) // ncols)
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (high - low) * (0.04 + 0.11 * rows))
        ax.legend(handles=handles, fontsize="small", ncols=ncols, loc="upper center", framealpha=0.8)


def curves_figure(runs: list[tuple[str, list[dict]]]) -> Figure:
    """A 3×3 grid against step, one panel per figure a GRPO run is judged by (PANELS); several runs
    overlay, one colour each, named in a legend under the grid. Up to FEW_POINTS points a series
    is drawn with markers; longer ones faint raw plus `smooth` on top."""
    # Fixed margins, not layout="constrained": the solver re-measures every label and took half of
    # the drawing time (0.8 of 1.5 s), paid at the end of every run.
    fig = Figure(figsize=(15, 11))
    fig.subplots_adjust(left=0.05, right=0.985, top=0.93, bottom=0.085 if len(runs) > 1 else 0.05)
    fig.subplots_adjust(wspace=0.2, hspace=0.16)
    axes = fig.subplots(3, 3, sharex=True).ravel()
    palette: dict[str, str] = {}
    for ax, (title, ylabel, series) in zip(axes, PANELS):
        _draw_panel(ax, runs, title, series, palette)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    switched = False
    for r, (_, rows) in enumerate(runs):
        for step in weight_switches(rows):
            switched = True
            for ax in axes:  # a dotted line at each switch, in the run's colour when runs overlay
                ax.axvline(step, color=f"C{r % 10}" if len(runs) > 1 else "0.35", linestyle=":", linewidth=1.2)
    for ax in axes[-3:]:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.25 on a three-step run
    smoothed = any(len(rows) > FEW_POINTS for _, rows in runs)
    how = " (faint: raw per step; solid: moving average)" if smoothed else ""
    how += "; dotted: reward weights switch (curriculum phases)" if switched else ""
    if len(runs) > 1:
        handles = [Line2D([], [], color=f"C{r % 10}", linewidth=2, label=label) for r, (label, _) in enumerate(runs)]
        fig.legend(handles=handles, loc="lower center", ncols=min(len(runs), 3))
        fig.suptitle(f"{len(runs)} runs{how}")
    else:
        fig.suptitle(f"{runs[0][0] if runs else 'run'}{how}")
    return fig


def nan_heatmap_figure(rows: list[dict]) -> Figure:
    """Which reward function returned None/NaN on how much of each step's batch: a function that
    fails on some steps only (a timeout, a sandbox limit) shows as stripes, one dead from the
    start as a full row. Steps missing from the file, or a function absent at a step, are grey."""
    names = list(dict.fromkeys(m["fn"] for row in rows for key in row if (m := NAN_FRAC.fullmatch(key))))
    steps = [int(row["step"]) for row in rows if isinstance(row.get("step"), int)]
    fig = Figure(figsize=(12, 2.2 + 0.4 * len(names)), layout="constrained")
    ax = fig.subplots()
    ax.set_title("reward failures: share of each step's completions scored NaN / None")
    if not names or not steps:
        ax.text(0.5, 0.5, "no reward/*/nan_frac in metrics.jsonl", transform=ax.transAxes, ha="center", va="center")
        ax.set_axis_off()
        return fig
    first, last = min(steps), max(steps)
    matrix = np.full((len(names), last - first + 1), np.nan)
    for row in rows:
        if isinstance(row.get("step"), int):
            for i, name in enumerate(names):
                matrix[i, row["step"] - first] = _number(row.get(f"reward/{name}/nan_frac"))
    cmap = colormaps["Reds"].with_extremes(bad="0.8")  # white at 0, grey where nothing was recorded
    # extent centres column j on step first+j, so the x axis reads in steps
    image = ax.imshow(
        np.ma.masked_invalid(matrix),
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        vmin=0.0,
        vmax=1.0,
        extent=(first - 0.5, last + 0.5, len(names) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("reward function")
    fig.colorbar(image, ax=ax, label="NaN share of the batch")
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Atomic, via a temporary file in the same directory: `grpo plot` on a running run and the
    trainer's own end-of-run drawing may write the same file, and a viewer must never read half."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        raise GrpoError(f"{path}: cannot write a figure as '{fmt or 'no extension'}'; use .png, .svg or .pdf")
    path.parent.mkdir(parents=True, exist_ok=True)
    # named by process (not mkstemp, whose 0600 would make the picture private); the format given
    # explicitly since the temporary name has no image extension
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format=fmt, dpi=100)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def draw_run_plots(run_dir: Path) -> list[Path]:
    """curves.png and nan_heatmap.png next to the run's metrics.jsonl, from what it holds now."""
    run_dir = Path(run_dir)
    rows = read_metrics_rows(run_dir)
    return [
        # parent too: a sweep's job is named 0, 1, ..., a run outputs/DATE/TIME
        save_figure(curves_figure([(f"{run_dir.parent.name}/{run_dir.name}", rows)]), run_dir / "curves.png"),
        save_figure(nan_heatmap_figure(rows), run_dir / "nan_heatmap.png"),
    ]


def _overrides(run_dir: Path) -> dict[str, str]:
    """Hydra's record of the command-line overrides: key -> the override as typed."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except yaml.YAMLError as err:
        raise GrpoError(f"{path}: not YAML ({err})") from None
    if not isinstance(items, list):
        return {}
    return {str(item).split("=", 1)[0].lstrip("+~"): str(item) for item in items}


def _job_dirs(sweep_dir: Path) -> list[Path]:
    jobs = [p for p in sweep_dir.iterdir() if (p / METRICS).is_file()]
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), p.name.zfill(8)))  # 2 before 10


def find_runs(paths: list[Path]) -> list[tuple[str, Path]]:
    """Runs named by what sets them apart: the overrides that differ between them (a sweep's
    `optim.lr=0.001 algo.beta=0`), else the directory's name."""
    run_dirs: list[Path] = []
    for path in map(Path, paths):
        if (path / METRICS).is_file():
            run_dirs.append(path)
        elif path.is_dir() and (jobs := _job_dirs(path)):
            run_dirs.extend(jobs)
        elif not path.exists():
            raise GrpoError(f"{path}: no such directory")
        else:
            raise GrpoError(
                f"{path}: neither a run directory (no {METRICS}) nor a multirun directory (no job subdirectory has one)"
            )
    overrides = [_overrides(d) for d in run_dirs]
    keys = dict.fromkeys(k for o in overrides for k in o)
    differing = {k for k in keys if len({o.get(k) for o in overrides}) > 1}
    labels = [" ".join(v for k, v in o.items() if k in differing) or d.name for d, o in zip(run_dirs, overrides)]
    return [(_unique(label, labels, d), d) for label, d in zip(labels, run_dirs)]


def _unique(label: str, labels: list[str], run_dir: Path) -> str:
    """Two runs with one label (same directory name, same overrides) would share a legend entry."""
    if labels.count(label) == 1:
        return label
    where = f"{run_dir.parent.name}/{run_dir.name}"
    return where if label == run_dir.name else f"{label} ({where})"
