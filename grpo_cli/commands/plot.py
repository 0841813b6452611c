"""`grpo plot RUN_DIR... [-o PATH]`: redraw one run's pictures in place, or overlay several runs.

A plain argparse command, not Hydra: it reads finished (or running) runs and composes no config.

    grpo plot outputs/2025-01-01/12-00-00                 # its curves.png and nan_heatmap.png
    grpo plot multirun/2025-01-01/12-00-00 -o sweep.png   # every job of a sweep, one figure
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_cli.errors import GrpoError
from grpo_cli.monitor.files import METRICS, read_metrics_rows
from grpo_cli.monitor.plots import curves_figure, draw_run_plots, find_runs, save_figure

DEFAULT_OVERLAY = Path("curves_overlay.png")
EXIT_BAD_INPUT = 2  # as argparse exits on a bad argument: both are the user's input


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo plot",
        description="Draw training curves from metrics.jsonl. One run directory: redraw its curves.png and "
        "nan_heatmap.png in place (a running run too). Several, or a multirun directory: one overlay figure.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a run directory (holds metrics.jsonl; the file itself will do) or a multirun directory "
        "(one job per subdirectory)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help=f"where the overlay goes (default: {DEFAULT_OVERLAY} in the one directory given, else in ./); "
        "with one run, its curves go here instead",
    )
    return parser


def run_dirs_of(paths: list[Path]) -> list[Path]:
    """A run's metrics.jsonl stands for its run directory: the file is what the curves are drawn
    from, and what a user finds first (`grpo plot RUN/metrics.jsonl`)."""
    return [path.parent if path.name == METRICS and path.is_file() else path for path in map(Path, paths)]


def plot(paths: list[Path], output: Path | None) -> list[Path]:
    paths = run_dirs_of(paths)
    runs = find_runs(paths)
    if output is None and len(runs) == 1 and runs[0][1] == paths[0]:
        return draw_run_plots(paths[0])
    figure = curves_figure([(label, read_metrics_rows(run_dir)) for label, run_dir in runs])
    if output is None:  # a multirun's overlay belongs beside its jobs, not wherever the shell happens to be
        output = paths[0] / DEFAULT_OVERLAY if len(paths) == 1 else DEFAULT_OVERLAY
    return [save_figure(figure, output)]


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    try:
        written = plot(args.runs, args.output)
    except GrpoError as err:
        print(f"grpo plot: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    for path in written:
        print(path)
