"""A user's own reward module, named by import path, through the real CLI."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Background, read_metrics, run_grpo


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    """Both `grpo train` runs at once: each pays seconds of torch import."""
    root = tmp_path_factory.mktemp("user_rewards")
    (root / "my_rewards.py").write_text(
        textwrap.dedent("""
        calls = {"n": 0}

        def sometimes_none(prompts, completions, answer, **_):
            return [None if i % 2 else float(c.strip() == a) for i, (c, a) in enumerate(zip(completions, answer))]

        def offline(prompts, completions, **_):
            raise ConnectionError("grader offline")

        def flaky(prompts, completions, **_):
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                raise ValueError("flaky")
            return [len(c) / 10 for c in completions]
    """)
    )
    functions = (
        "[{name: half, target: 'my_rewards:sometimes_none'}, {name: flaky, target: 'my_rewards:flaky'},"
        " {name: offline, target: 'my_rewards:offline', fallback: half}]"
    )
    cases = {
        "user_reward_with_failures_trains_and_reports_nan_rates": lambda: run_grpo(
            "train",
            f"reward.functions={functions}",
            "train.steps=4",
            "train.prompts_per_step=2",
            "reward.max_consecutive_failures=3",
            "rollout.num_generations=4",
            f"hydra.run.dir={root / 'run'}",
            cwd=root,
            env={"PYTHONPATH": str(root)},
        ),
        "wrong_import_path_fails_before_model_loads": lambda: run_grpo(
            "train", "reward.functions=[{name: x, target: 'nowhere.mod:fn'}]", f"hydra.run.dir={root / 'wrong'}"
        ),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def test_user_reward_with_failures_trains_and_reports_nan_rates(runs: tuple[Background, Path]) -> None:
    """One function returns None for half the samples and another raises on one batch in three:
    training completes and metrics show each function's NaN rate."""
    background, root = runs
    result, run_dir = background.result("user_reward_with_failures_trains_and_reports_nan_rates"), root / "run"
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert [m["reward/half/nan_frac"] for m in metrics] == [0.5] * 4
    # raising one batch in three never reaches 3 failures in a row: never masked
    assert [m["reward/flaky/nan_frac"] for m in metrics] == [0.0, 0.0, 1.0, 0.0]
    # raising every batch is masked at the third, with an alert on the console
    assert [m["reward/masked_functions"] for m in metrics] == [0, 0, 1, 1]
    assert "alert (step 3)" in result.stderr and "offline" in result.stderr
    assert abs(sum(v for k, v in metrics[-1].items() if k.startswith("weight_effect/")) - 1) < 1e-6
    assert all(m["reward/mean"] is not None and not math.isnan(m["reward/mean"]) for m in metrics)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4


def test_wrong_import_path_fails_before_model_loads(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result, run_dir = background.result("wrong_import_path_fails_before_model_loads"), root / "wrong"
    assert result.returncode != 0
    assert "nowhere.mod:fn" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "tiny_model").exists()
