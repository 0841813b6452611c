"""reward=code through the real CLI: the sandbox backend is reported everywhere a user looks."""

from __future__ import annotations

import json

from tests.conftest import read_metrics, run_grpo

BACKENDS = {"bwrap", "unshare", "process"}


def test_train_reports_the_sandbox_backend_at_startup_in_metrics_and_summary(tmp_path):
    run_dir = tmp_path / "run"
    result = run_grpo("train", "reward=code", "debug=smoke", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    backend = json.loads((run_dir / "summary.json").read_text())["sandbox_backend"]
    assert backend in BACKENDS
    assert f"sandbox backend: {backend}" in result.stdout + result.stderr
    assert all(row["sandbox_backend"] == backend for row in read_metrics(run_dir))
    assert "kind: code" in (run_dir / "config.yaml").read_text()  # reward=code brings its data


def test_require_isolation_refuses_to_start_on_the_plain_process_backend(tmp_path):
    result = run_grpo(
        "train",
        "reward=code",
        "debug=smoke",
        "sandbox.backend=process",
        "sandbox.require_isolation=true",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode != 0
    assert "code_tests" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "tiny_model").exists()  # refused before any model was built


def test_the_sandbox_section_picks_the_backend_and_a_bad_value_names_its_key(tmp_path):
    run_dir = tmp_path / "run"
    args = ("train", "reward=code", "debug=smoke", f"hydra.run.dir={run_dir}")
    result = run_grpo(*args, "sandbox.backend=process", "sandbox.prewarm=false", "sandbox.workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["sandbox_backend"] == "process"
    bad = run_grpo(*args, "sandbox.backend=docker")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "sandbox.backend='docker'" in bad.stderr and "auto, bwrap, unshare, process" in bad.stderr


def test_score_summary_names_the_backend(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    row = {
        "prompt": "def double(x):\n",
        "entry_point": "double",
        "reference": "def double(x):\n    return 2 * x\n",
        "test_list": ["assert double(2) == 4", "assert double(-1) == -2"],
        "completions": [{"text": "    return x + x\n"}, {"text": "    return x * x\n"}],
    }
    rollouts.write_text(json.dumps(row) + "\n")
    result = run_grpo("score", f"input={rollouts}", f"output={tmp_path / 'scored.jsonl'}", "reward=code")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "score_summary.json").read_text())
    assert summary["sandbox_backend"] in BACKENDS
    scored = json.loads((tmp_path / "scored.jsonl").read_text())
    assert [c["rewards"]["code_tests"] for c in scored["completions"]] == [1.0, 0.5]  # 2*2 == 2**2 passes once
