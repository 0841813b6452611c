"""reward=code through the real CLI: the sandbox backend is reported everywhere a user looks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Background, read_metrics, run_grpo

BACKENDS = {"bwrap", "unshare", "process"}
CODE_SMOKE = ("train", "reward=code", "debug=smoke")


def _score_rollouts(root: Path) -> Path:
    rollouts = root / "rollouts.jsonl"
    row = {
        "prompt": "def double(x):\n",
        "entry_point": "double",
        "reference": "def double(x):\n    return 2 * x\n",
        "test_list": ["assert double(2) == 4", "assert double(-1) == -2"],
        "completions": [{"text": "    return x + x\n"}, {"text": "    return x * x\n"}],
    }
    rollouts.write_text(json.dumps(row) + "\n")
    return rollouts


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    """The module's five `grpo` runs, started together: each pays seconds of torch import."""
    root = tmp_path_factory.mktemp("code_runs")
    (root / "score").mkdir()
    rollouts = _score_rollouts(root / "score")
    cases = {
        "train_reports_the_sandbox_backend_at_startup_in_metrics_and_summary": lambda: run_grpo(
            *CODE_SMOKE, f"hydra.run.dir={root / 'auto'}", timeout=300
        ),
        "require_isolation_refuses_to_start_on_the_plain_process_backend": lambda: run_grpo(
            *CODE_SMOKE,
            "sandbox.backend=process",
            "sandbox.require_isolation=true",
            f"hydra.run.dir={root / 'refused'}",
        ),
        "the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key:process": lambda: run_grpo(
            *CODE_SMOKE,
            f"hydra.run.dir={root / 'process'}",
            "sandbox.backend=process",
            "sandbox.prewarm=false",
            "sandbox.workers=1",
            timeout=300,
        ),
        "the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key:docker": lambda: run_grpo(
            *CODE_SMOKE, f"hydra.run.dir={root / 'docker'}", "sandbox.backend=docker"
        ),
        "score_summary_names_the_backend": lambda: run_grpo(
            "score", f"input={rollouts}", f"output={root / 'score' / 'scored.jsonl'}", "reward=code"
        ),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def test_train_reports_the_sandbox_backend_at_startup_in_metrics_and_summary(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result, run_dir = (
        background.result("train_reports_the_sandbox_backend_at_startup_in_metrics_and_summary"),
        root / "auto",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    backend = json.loads((run_dir / "summary.json").read_text())["sandbox_backend"]
    assert backend in BACKENDS
    assert f"sandbox backend: {backend}" in result.stdout + result.stderr
    metrics = read_metrics(run_dir)
    assert len(metrics) == 2 and all(row["sandbox_backend"] == backend for row in metrics)
    assert "kind: code" in (run_dir / "config.yaml").read_text()  # reward=code brings its data
    for name in ("code_compiles", "code_tests", "code_style", "code_similarity"):
        assert all(m[f"reward/{name}/nan_frac"] == 0.0 for m in metrics), name  # random text scores 0, not None


def test_require_isolation_refuses_to_start_on_the_plain_process_backend(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("require_isolation_refuses_to_start_on_the_plain_process_backend")
    assert result.returncode != 0
    assert "code_tests" in result.stderr and "Traceback" not in result.stderr
    assert not (root / "refused" / "tiny_model").exists()  # refused before any model was built


def test_the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key:process")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((root / "process" / "summary.json").read_text())["sandbox_backend"] == "process"
    bad = background.result("the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key:docker")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "sandbox.backend='docker'" in bad.stderr and "auto, bwrap, unshare, process" in bad.stderr


def test_score_summary_names_the_backend(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("score_summary_names_the_backend")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((root / "score" / "scored.jsonl.summary.json").read_text())
    assert summary["sandbox_backend"] in BACKENDS
    scored = json.loads((root / "score" / "scored.jsonl").read_text())
    assert [c["rewards"]["code_tests"] for c in scored["completions"]] == [1.0, 0.5]  # 2*2 == 2**2 passes once
