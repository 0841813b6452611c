"""Pictures of a run: curves.png and nan_heatmap.png from a real metrics.jsonl (a running one too),
overlays of several runs named by their differing overrides, and `grpo plot` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from grpo_cli.commands.plot import main as plot_main
from grpo_cli.core.update_stats import UpdateStats
from grpo_cli.errors import GrpoError
from grpo_cli.monitor.files import read_metrics_rows
from grpo_cli.monitor.plots import curves_figure, find_runs, nan_heatmap_figure, weight_switches
from tests.conftest import run_grpo

# Three steps as the trainer writes them: kl null throughout (beta=0), format's mean null at step 2
# (every completion NaN), entropy missing from step 2, no eval keys at all.
ROWS = [
    {
        "step": 1,
        "reward/mean": 0.2,
        "reward/exact_match/mean": 0.0,
        "reward/format/mean": 0.5,
        "reward/exact_match/nan_frac": 0.0,
        "reward/format/nan_frac": 0.25,
        "weight/exact_match": 1.0,
        "weight/format": 0.5,
        "kl": None,
        "entropy": 1.5,
    },
    {
        "step": 2,
        "reward/mean": 0.4,
        "reward/exact_match/mean": 0.5,
        "reward/format/mean": None,
        "reward/exact_match/nan_frac": 0.5,
        "reward/format/nan_frac": None,
        "weight/exact_match": 1.0,
        "weight/format": 0.5,
        "kl": None,
    },
    {
        "step": 3,
        "reward/mean": 0.6,
        "reward/exact_match/mean": 1.0,
        "reward/format/mean": 0.75,
        "reward/exact_match/nan_frac": 1.0,
        "reward/format/nan_frac": 0.0,
        "weight/exact_match": 1.0,
        "weight/format": 0.5,
        "kl": None,
        "entropy": 1.25,
    },
]


def write_run(run_dir: Path, rows: list[dict] = ROWS, overrides: list[str] | None = None, tail: str = "") -> Path:
    """A run directory as Hydra and MetricsFile leave it; `tail` is a line still being written."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return run_dir


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def shown_labels(ax) -> list:
    """The axis and tick labels an axes shows, as matplotlib Text objects (after a draw): ticks
    outside the view are never drawn."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    ticks = [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
    ticks += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
    return [text for text in [ax.xaxis.label, ax.yaxis.label, *ticks] if text.get_visible() and text.get_text()]


# ---- reading metrics.jsonl ------------------------------------------------------------------------
def test_a_running_run_is_read_up_to_its_partial_last_line(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", tail='{"step": 4, "reward/me')
    rows = read_metrics_rows(run)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert rows[0]["kl"] is None


def test_a_broken_line_in_the_middle_names_the_file_and_line(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": 2, "rew', lines[2]]) + "\n")
    with pytest.raises(GrpoError, match=rf"{run / 'metrics.jsonl'}:2: not a JSON line"):
        read_metrics_rows(run)


def test_a_directory_without_metrics_is_named(tmp_path: Path) -> None:
    with pytest.raises(GrpoError, match=str(tmp_path / "metrics.jsonl")):
        read_metrics_rows(tmp_path)


# ---- the figures ----------------------------------------------------------------------------------
def test_the_heatmap_image_is_the_nan_frac_matrix() -> None:
    image = nan_heatmap_figure(ROWS).axes[0].images[0]
    # rows: functions in the order metrics.jsonl names them; columns: steps 1..3; null is a hole
    expected = np.array([[0.0, 0.5, 1.0], [0.25, np.nan, 0.0]])
    np.testing.assert_array_equal(np.ma.filled(image.get_array(), np.nan), expected)
    assert image.get_extent() == [0.5, 3.5, 1.5, -0.5]  # column j centred on step j+1
    assert [t.get_text() for t in image.axes.get_yticklabels()] == ["exact_match", "format"]
    assert image.get_clim() == (0.0, 1.0)


def test_a_run_without_nan_frac_gets_a_heatmap_that_says_so() -> None:
    fig = nan_heatmap_figure([{"step": 1, "reward/mean": 0.5}])
    assert any("no reward/*/nan_frac" in text for text in texts(fig.axes[0]))


def test_null_and_missing_keys_skip_points_never_crash() -> None:
    by_title = panels(curves_figure([("run", ROWS)]))
    assert [text for ax in by_title.values() for text in texts(ax)] == [
        "no data",  # eval reward: no eval/ keys
        "no data",  # policy loss
        "no data",  # gradient norm
        "no data (null in every row)",  # KL with beta=0
        "no data",  # clip epsilons
        "no data",  # clipped tokens
        "no data",  # completion length
        "no data",  # diversity
        "no data",  # repetition
    ]
    reward = by_title["reward"]
    assert [t.get_text() for t in reward.get_legend().get_texts()] == ["fused", "exact_match", "format"]
    format_line = reward.lines[2]
    assert np.isnan(format_line.get_ydata()[1])  # a gap at the null, not a zero
    assert list(by_title["entropy"].lines[0].get_xdata()) == [1, 3]  # the row without the key is skipped


def test_curriculum_phase_changes_are_drawn_in_every_panel() -> None:
    """three_phase over 10 steps switches at steps 3 and 7: a dotted line there in each panel that
    has data (none in an empty one), and none for a run whose weights never change (ROWS)."""
    weights = [(0.7, 0.2)] * 2 + [(0.3, 0.6)] * 4 + [(0.1, 0.3)] * 4
    rows = [
        {"step": i + 1, "reward/mean": 0.1 * i, "weight/code_compiles": c, "weight/code_tests": t}
        for i, (c, t) in enumerate(weights)
    ]
    assert weight_switches(rows) == [3, 7] and weight_switches(ROWS) == []
    fig = curves_figure([("three_phase", rows)])
    for ax in fig.axes:
        vertical = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert vertical == ([3, 7] if ax.get_title() in ("reward", "reward weights") else []), ax.get_title()
    assert "curriculum phases" in fig._suptitle.get_text()
    assert not any(line.get_linestyle() == ":" for ax in curves_figure([("run", ROWS)]).axes for line in ax.get_lines())


def test_an_overlay_gives_each_run_one_colour_and_each_series_a_line_style() -> None:
    fig = curves_figure([("lr=1", ROWS), ("lr=2", ROWS)])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["lr=1", "lr=2"]
    lines = panels(fig)["reward"].lines  # run 1's three series, then run 2's
    assert [line.get_color() for line in lines] == ["C0"] * 3 + ["C1"] * 3
    assert len({line.get_linestyle() for line in lines[:3]}) == 3
    assert [line.get_linestyle() for line in lines[:3]] == [line.get_linestyle() for line in lines[3:]]


def test_a_long_run_is_drawn_faint_and_smoothed() -> None:
    rows = [{"step": s, "entropy": float(s % 2)} for s in range(1, 101)]  # 0, 1, 0, 1: pure noise
    raw, smoothed = panels(curves_figure([("run", rows)]))["entropy"].lines
    assert raw.get_alpha() < 0.5 and smoothed.get_alpha() is None
    # a centred window of 5 points (5% of 100): away from the ends, 2 or 3 ones out of 5
    assert set(np.round(smoothed.get_ydata()[2:-2], 2)) == {0.4, 0.6}


def update_rows(steps: int = 3) -> list[dict]:
    """Steps as the trainer logs its update: UpdateStats.metrics() is what policy_update reports."""
    return [
        {
            "step": s,
            **UpdateStats(
                loss=0.01 * s,
                kl=None,
                clip_frac_low=0.0,
                clip_frac_high=0.02,
                grad_norm=0.5 + s,
                optimizer_steps=1,
                skipped_updates=0,
                entropy=1.0,
            ).metrics(),
        }
        for s in range(1, steps + 1)
    ]


def test_the_loss_and_the_gradient_norm_have_panels_of_their_own() -> None:
    by_title = panels(curves_figure([("run", update_rows())]))
    assert list(by_title["policy loss"].lines[0].get_ydata()) == pytest.approx([0.01, 0.02, 0.03])
    assert list(by_title["gradient norm"].lines[0].get_ydata()) == [1.5, 2.5, 3.5]
    assert [t.get_text() for t in by_title["clipped tokens"].get_legend().get_texts()] == ["low", "high"]


def test_series_that_coincide_both_stay_visible() -> None:
    """epsilon_low = epsilon_high and two weights of 1.0: the line drawn second lies on the first, so
    it must be thinner, with smaller markers of another shape, and the first show around it."""
    rows = [
        {"step": s, "clip/epsilon_low": 0.2, "clip/epsilon_high": 0.2, "weight/a": 1.0, "weight/b": 1.0}
        for s in range(1, 4)
    ]
    by_title = panels(curves_figure([("run", rows)]))
    for title in ("clip epsilons", "reward weights"):
        under, over = by_title[title].lines
        assert under.get_linestyle() != over.get_linestyle() and under.get_marker() != over.get_marker()
        assert under.get_linewidth() > over.get_linewidth() and under.get_markersize() > over.get_markersize()
        legend = by_title[title].get_legend().get_lines()  # the legend shows each line as drawn
        assert [(h.get_linestyle(), h.get_marker()) for h in legend] == [
            (line.get_linestyle(), line.get_marker()) for line in (under, over)
        ]


def test_in_an_overlay_the_first_run_shows_around_the_second_where_they_agree() -> None:
    """Two runs of the same values: run 1's lines lie on run 0's, and within a run equal series
    may lie on one another too. Run 0 is drawn wider; every marker is smaller than those before it."""
    lines = panels(curves_figure([("lr=1", ROWS), ("lr=2", ROWS)]))["reward"].lines
    assert len(lines) == 6  # run 0's three series, then run 1's
    assert all(a.get_linewidth() > b.get_linewidth() for a, b in zip(lines[:3], lines[3:]))
    sizes = [line.get_markersize() for line in lines]
    assert all(a > b for a, b in zip(sizes, sizes[1:]))


def test_a_panel_without_data_says_so_and_draws_no_empty_box() -> None:
    by_title = panels(curves_figure([("run", ROWS)]))
    empty, full = by_title["eval reward"], by_title["reward"]
    assert texts(empty) == ["no data"]
    assert not empty.get_frame_on() and empty.get_ylabel() == ""
    assert not any(label.get_visible() for label in empty.get_yticklabels())
    assert not any(line.get_visible() for line in empty.get_ygridlines())
    assert full.get_frame_on() and full.get_ylabel() == "mean reward"
    assert any(line.get_visible() for line in full.get_ygridlines())
    # the lowest panel with data in a column shows the steps; no label runs into a panel's title
    fig = full.figure
    fig.draw_without_rendering()
    assert [t.get_text() for t in shown_labels(full) if t in full.get_xticklabels()] == ["1", "2", "3"]
    for ax in fig.axes:
        for other in fig.axes:
            for text in shown_labels(ax):
                assert not text.get_window_extent().overlaps(other.title.get_window_extent()), (
                    ax.get_title(),
                    text.get_text(),
                    other.get_title(),
                )


def test_a_heatmap_without_a_failure_says_so() -> None:
    rows = [{"step": s, "reward/a/nan_frac": 0.0, "reward/b/nan_frac": 0.0} for s in (1, 2)]
    assert any("no failures" in text for text in texts(nan_heatmap_figure(rows).axes[0]))
    assert texts(nan_heatmap_figure(ROWS).axes[0]) == []  # failures: the map speaks for itself


def test_the_overlay_legend_covers_no_panel_and_no_label() -> None:
    labels = [f"optim.lr={lr} algo.beta=0.04 rollout.temperature=0.9" for lr in (1e-4, 2e-4, 5e-4, 1e-3, 2e-3)]
    fig = curves_figure([(label, ROWS) for label in labels])
    fig.draw_without_rendering()
    legend = fig.legends[0].get_window_extent()
    assert legend.x0 >= 0 and legend.y0 >= 0 and legend.x1 <= fig.bbox.x1 and legend.y1 <= fig.bbox.y1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == labels
    step = fig._supxlabel  # "step", once under the grid
    assert step.get_text() == "step" and not legend.overlaps(step.get_window_extent())
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent()), ax.get_title()
        assert step.get_window_extent().y1 < ax.get_window_extent().y0
        for text in shown_labels(ax):
            assert not legend.overlaps(text.get_window_extent()), (ax.get_title(), text.get_text())


# ---- finding and naming runs ----------------------------------------------------------------------
def test_a_multirun_is_named_by_the_overrides_that_differ(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    common = ["train.steps=3"]
    write_run(sweep / "0", overrides=["optim.lr=0.001", "algo.beta=0", *common])
    write_run(sweep / "1", overrides=["optim.lr=0.001", "algo.beta=0.04", *common])
    write_run(sweep / "10", overrides=["optim.lr=0.002", "algo.beta=0", *common])
    (sweep / "2" / ".hydra").mkdir(parents=True)  # a job that failed before its first step
    (sweep / ".hydra").mkdir()  # Hydra's own folder of the sweep
    assert find_runs([sweep]) == [
        ("optim.lr=0.001 algo.beta=0", sweep / "0"),
        ("optim.lr=0.001 algo.beta=0.04", sweep / "1"),
        ("optim.lr=0.002 algo.beta=0", sweep / "10"),  # 10 after 1, not between 1 and 2
    ]


def test_runs_without_differing_overrides_are_named_by_directory(tmp_path: Path) -> None:
    same = ["optim.lr=0.001"]
    a, b = write_run(tmp_path / "x" / "run_a", overrides=same), write_run(tmp_path / "x" / "run_b", overrides=same)
    assert [label for label, _ in find_runs([a, b])] == ["run_a", "run_b"]
    # no overrides file and one directory name: the parent tells them apart
    c, d = write_run(tmp_path / "c" / "run"), write_run(tmp_path / "d" / "run")
    assert [label for label, _ in find_runs([c, d])] == ["c/run", "d/run"]


def test_neither_a_run_nor_a_multirun_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(GrpoError, match=rf"{tmp_path / 'empty'}: neither a run directory"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(GrpoError, match=rf"{tmp_path / 'nope'}: no such directory"):
        find_runs([tmp_path / "nope"])


# ---- `grpo plot` ----------------------------------------------------------------------------------
def test_plot_one_run_redraws_its_pictures_in_place(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "run", tail='{"step": 4')  # still running
    plot_main([str(run)])
    assert capsys.readouterr().out.split() == [str(run / "curves.png"), str(run / "nan_heatmap.png")]
    assert imread(run / "curves.png").shape == (1455, 1500, 4)  # 4 x 3 panels of 5 x 3.3 in, margins 1.35 in
    assert imread(run / "nan_heatmap.png").shape[:2] == (300, 1200)  # 2.2 in + 0.4 in per function
    assert sorted(p.name for p in run.iterdir()) == ["curves.png", "metrics.jsonl", "nan_heatmap.png"]  # no temp


def test_grpo_plot_overlays_runs(tmp_path: Path) -> None:
    one = write_run(tmp_path / "one", overrides=["optim.lr=0.001"])
    two = write_run(tmp_path / "two", overrides=["optim.lr=0.002"])
    out = tmp_path / "figs" / "overlay.png"
    result = run_grpo("plot", str(one), str(two), "-o", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(out)]
    assert imread(out).shape == (1502, 1500, 4)  # grown by a row of run legend: 0.32 in + 0.15 in
    assert not (one / "curves.png").exists()  # an overlay leaves the runs alone


def test_grpo_plot_on_a_bad_path_says_which(tmp_path: Path) -> None:
    result = run_grpo("plot", str(tmp_path / "nope"), timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"grpo plot: error: {tmp_path / 'nope'}: no such directory"


def test_top_level_help_lists_plot() -> None:
    result = run_grpo("--help", timeout=120)
    assert result.returncode == 0
    assert any(line.split()[:1] == ["plot"] for line in result.stdout.splitlines())
