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
LONG_MARKS = 8  # a longer series: about this many markers on its moving average, to tell lines apart
# no dotted style among a series' styles: dotted is the weight switches' vertical line
LINESTYLES = ("-", "--", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (12, 3)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
# Lines that may lie on one another (epsilon_low = epsilon_high, equal weights, a sweep's runs that
# agree) are drawn first-widest: each later one is thinner with smaller markers, inside the one
# before, which still shows around it. Widths and marker sizes spread over these ranges; in an
# overlay the width steps by run (the runs are what must not hide), the marker size by every line.
WIDTHS = (1.2, 4.4)
MARKER_SIZES = (3.5, 9.5)
COLUMNS = 3  # of panels; as many rows as PANELS needs
PANEL_IN = (5.0, 3.3)  # one panel's share of the figure, inches
TOP_IN, BOTTOM_IN = 0.75, 0.6  # the suptitle above; tick labels and "step" below the grid
LEGEND_ROW_IN = 0.32  # one row of the overlay's run legend, under the "step" labels

# (title, y label, series): each series is a key pattern (re.fullmatch) and its legend label, which
# may name the pattern's groups. Within a panel, series keep this order, matched keys sorted.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", "mean reward", (("reward/mean", "fused"), (r"reward/(?P<fn>[^/]+)/mean", "{fn}"))),
    ("eval reward", "mean reward", (("eval/reward/mean", "fused"), (r"eval/reward/(?P<fn>[^/]+)/mean", "{fn}"))),
    ("reward weights", "effective weight", ((r"weight/(?P<fn>[^/]+)", "{fn}"),)),
    ("policy loss", "loss (mean over optimizer steps)", (("loss", "loss"),)),
    ("gradient norm", "L2 norm, before clipping", (("grad_norm", "grad norm"),)),
    ("KL to the reference", "KL", (("kl", "kl"),)),
    ("clip epsilons", "epsilon", (("clip/epsilon_low", "low"), ("clip/epsilon_high", "high"))),
    ("clipped tokens", "share of loss tokens", (("clip_frac/low", "low"), ("clip_frac/high", "high"))),
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


def _look(series: int, width_rank: tuple[int, int], size_rank: tuple[int, int]) -> dict[str, object]:
    """A line's series style (line style and marker), and its width and marker size by its rank
    (place, count) in the drawing order among the lines that may coincide: the first widest."""

    def spread(rank: tuple[int, int], low_high: tuple[float, float]) -> float:
        place, count = rank
        return low_high[0] + (count - 1 - place) / max(count - 1, 1) * (low_high[1] - low_high[0])

    return {
        "linestyle": LINESTYLES[series % len(LINESTYLES)],
        "marker": MARKERS[series % len(MARKERS)],
        "linewidth": spread(width_rank, WIDTHS),
        "markersize": spread(size_rank, MARKER_SIZES),
    }


def _draw_panel(ax: Axes, runs: list[tuple[str, list[dict]]], title: str, series: tuple, palette: dict) -> bool:
    """One panel; False, with a "no data" note in place of an empty frame, when no series has a number."""
    keys = _panel_keys(series, list(dict.fromkeys(k for _, rows in runs for row in rows for k in row)))
    several = len(runs) > 1
    drawn: dict[str, tuple[str, dict]] = {}  # series label -> (colour, look), for the legend
    for r, (_, rows) in enumerate(runs):
        for s, (key, label) in enumerate(keys.items()):
            steps, values = _series(rows, key)
            if not np.isfinite(values).any():
                continue  # absent, or null throughout (KL with beta=0)
            # several runs: one colour per run across panels, series told apart by line style and
            # marker; one run: a colour per series label, the same in every panel (exact_match in
            # reward, eval and weights alike). Either way each line is drawn inside the ones before.
            color = f"C{r % 10}" if several else palette.setdefault(label, f"C{len(palette) % 10}")
            line = (r * len(keys) + s, len(runs) * len(keys))  # its place among the panel's lines
            look = _look(s, (r, len(runs)) if several else line, line)
            if len(values) <= FEW_POINTS:
                ax.plot(steps, values, color=color, **look)
            else:
                ax.plot(steps, values, color=color, linestyle=look["linestyle"], linewidth=0.7, alpha=0.25)
                ax.plot(steps, smooth(values), color=color, markevery=max(1, len(values) // LONG_MARKS), **look)
            drawn.setdefault(label, ("0.3", _look(s, (0, 1), (0, 1))) if several else (color, look))
    ax.set_title(title)
    if not drawn:
        note = "no data (null in every row)" if keys else "no data"
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="0.45")
        ax.set_frame_on(False)
        ax.tick_params(left=False, labelleft=False, bottom=False, labelbottom=False)
        return False
    if len(drawn) > 1:
        handles = [Line2D([], [], color=color, label=label, **look) for label, (color, look) in drawn.items()]
        # above the data, never on it: raise the top of the y range by the legend's rows
        # as many columns as fit the panel's width (about 7 px a character, 40 px for the line)
        ncols = min(len(handles), 3, max(1, 400 // (40 + 7 * max(map(len, drawn)))))
        rows = -(-len(handles) // ncols)
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (high - low) * (0.04 + 0.11 * rows))
        ax.legend(handles=handles, fontsize="small", ncols=ncols, loc="upper center", framealpha=0.8)
    return True


def _label_steps(axes: np.ndarray, full: np.ndarray) -> None:
    """Step ticks under the lowest panel with data in each column (an empty panel has no axis)."""
    for column in range(axes.shape[1]):
        if rows := [r for r in range(axes.shape[0]) if full[r, column]]:
            ax = axes[rows[-1], column]
            ax.tick_params(labelbottom=True)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.25 on a three-step run


def _run_legend_shape(labels: list[str]) -> tuple[int, int]:
    """(columns, rows) of the overlay's run legend: as many columns as fit the figure's width (about
    8 px a character, 60 px for the line and the padding), at most 3."""
    fit = int(COLUMNS * PANEL_IN[0] * 100 * 0.95) // (60 + 8 * max(map(len, labels)))
    columns = max(1, min(len(labels), 3, fit))
    return columns, -(-len(labels) // columns)


def curves_figure(runs: list[tuple[str, list[dict]]]) -> Figure:
    """A grid of panels against step, one per figure a GRPO run is judged by (PANELS); several runs
    overlay, one colour each, named in a legend under the grid (the figure grows to hold it). Up to
    FEW_POINTS points a series is drawn with markers; longer ones faint raw plus `smooth` on top."""
    nrows, ncols = -(-len(PANELS) // COLUMNS), COLUMNS
    legend_cols, legend_rows = _run_legend_shape([label for label, _ in runs]) if len(runs) > 1 else (0, 0)
    bottom_in = BOTTOM_IN + LEGEND_ROW_IN * legend_rows + (0.15 if legend_rows else 0.0)
    height = TOP_IN + nrows * PANEL_IN[1] + bottom_in
    # Fixed margins, not layout="constrained": the solver re-measures every label and took half of
    # the drawing time (0.8 of 1.5 s), paid at the end of every run.
    fig = Figure(figsize=(ncols * PANEL_IN[0], height))
    fig.subplots_adjust(left=0.05, right=0.985, top=1 - TOP_IN / height, bottom=bottom_in / height)
    fig.subplots_adjust(wspace=0.2, hspace=0.18)
    axes = fig.subplots(nrows, ncols, sharex=True)
    palette: dict[str, str] = {}
    full = np.zeros(axes.shape, dtype=bool)  # which panels have data
    for i, (ax, (title, ylabel, series)) in enumerate(zip(axes.flat, PANELS)):
        full.flat[i] = _draw_panel(ax, runs, title, series, palette)
        if full.flat[i]:
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    for ax in axes.flat[len(PANELS) :]:  # the last row's spare places
        ax.remove()
    _label_steps(axes, full)
    # one "step" under the grid, not one per column: a column's lowest panel with data may be an
    # inner one, whose label would sit on the (empty) panel's title below
    fig.supxlabel("step", y=(bottom_in - BOTTOM_IN + 0.08) / height, va="bottom")
    switched = False
    for r, (_, rows) in enumerate(runs):
        for step in weight_switches(rows):
            switched = True
            for ax in axes[full]:  # a dotted line at each switch, in the run's colour when runs overlay
                ax.axvline(step, color=f"C{r % 10}" if len(runs) > 1 else "0.35", linestyle=":", linewidth=1.2)
    smoothed = any(len(rows) > FEW_POINTS for _, rows in runs)
    how = " (faint: raw per step; solid: moving average)" if smoothed else ""
    how += "; dotted: reward weights switch (curriculum phases)" if switched else ""
    if len(runs) > 1:
        handles = [
            Line2D([], [], color=f"C{r % 10}", linewidth=_look(0, (r, len(runs)), (0, 1))["linewidth"], label=label)
            for r, (label, _) in enumerate(runs)
        ]
        # below the "step" labels, in the margin grown for it: never on a panel or a label
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.05 / height), ncols=legend_cols)
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
    known = matrix[np.isfinite(matrix)]
    if not (known > 0).any():  # an all-white (or all-grey) map reads as a blank box: say what it means
        note = "no failures: every reward function scored every completion" if known.size else "no share recorded"
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="0.3")
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
    named = run_dir.resolve()  # `grpo plot run` from its parent: Path("run").parent has no name
    return [
        # parent too: a sweep's job is named 0, 1, ..., a run outputs/DATE/TIME
        save_figure(curves_figure([(f"{named.parent.name}/{named.name}", rows)]), run_dir / "curves.png"),
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
