"""`grpo score` through the real CLI: the file contract, advantages, summary, failures."""

from __future__ import annotations

import json
import statistics
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Background, run_grpo


def write_rollouts(path, groups):
    with path.open("w") as handle:
        for prompt, answer, texts in groups:
            completions = [{"text": t, "token_count": len(t) + 1, "finish_reason": "stop"} for t in texts]
            handle.write(json.dumps({"prompt": prompt, "answer": answer, "completions": completions}) + "\n")


def _score(root: Path, groups, *args: str, output: str = "scored.jsonl", bad_line: str = "", **kwargs):
    """`grpo score` of `groups` (and `bad_line`) in ROOT/rollouts.jsonl into ROOT/OUTPUT, to be run later."""
    root.mkdir(parents=True, exist_ok=True)
    write_rollouts(root / "rollouts.jsonl", groups)
    with (root / "rollouts.jsonl").open("a") as handle:
        handle.write(bad_line)
    return lambda: run_grpo("score", f"input={root / 'rollouts.jsonl'}", f"output={root / output}", *args, **kwargs)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    """The module's `grpo score` runs, started together: each pays a second or more of start-up."""
    root = tmp_path_factory.mktemp("score")
    (root / "masked").mkdir()
    (root / "masked" / "my_rewards.py").write_text(
        textwrap.dedent("""
        def broken(prompts, completions, **_):
            raise RuntimeError("grader offline")
    """)
    )
    functions = (
        "[{name: broken, target: 'my_rewards:broken', weight: 2.0, fallback: exact},"
        " {name: exact, target: exact_match, weight: 1.0}]"
    )
    cases = {
        "score_writes_rewards_fused_reward_and_group_advantages": _score(
            root / "advantages",
            [("1+1=", "2", ["2", "3", "2", "22"]), ("2+2=", "4", ["4", "4", "4", "4"])],
            "reward=exact_match",
            output="out/scored.jsonl",
        ),
        "failing_function_is_masked_with_an_alert_and_its_fallback_takes_over": _score(
            root / "masked",
            [(f"{i}+0=", str(i), [str(i), "x"]) for i in range(5)],
            f"reward.functions={functions}",
            "reward.max_consecutive_failures=3",
            "batch_size=1",
            cwd=root / "masked",
            env={"PYTHONPATH": str(root / "masked")},
        ),
        "bad_rollouts_file_names_file_and_line:bad_line": _score(
            root / "bad_line",
            [("1+1=", "2", ["2", "3"])],
            "reward=exact_match",
            bad_line='{"prompt": "x", "completions": [\n',
        ),
        "bad_rollouts_file_names_file_and_line:missing": lambda: run_grpo(
            "score", f"input={root / 'missing.jsonl'}", f"output={root / 'missing_scored.jsonl'}"
        ),
        "mixed_group_sizes_are_refused": _score(
            root / "mixed", [("1+1=", "2", ["2", "3"]), ("1+2=", "3", ["3", "3", "1"])], "reward=exact_match"
        ),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def test_score_writes_rewards_fused_reward_and_group_advantages(runs: tuple[Background, Path]) -> None:
    background, root = runs
    scored = root / "advantages" / "out" / "scored.jsonl"
    result = background.result("score_writes_rewards_fused_reward_and_group_advantages")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["1+1=", "2+2="]
    first = rows[0]["completions"]
    assert [c["rewards"] == {"exact_match": c["reward"]} for c in first] == [True] * 4
    assert [c["reward"] for c in first] == [1.0, 0.0, 1.0, 0.0]
    mean, std = 0.5, statistics.stdev([1.0, 0.0, 1.0, 0.0])  # unbiased, as the trainer uses
    for c in first:
        assert abs(c["advantage"] - (c["reward"] - mean) / (std + 1e-4)) < 1e-6
    assert [c["advantage"] for c in rows[1]["completions"]] == [0.0] * 4  # zero-variance group
    assert first[0]["token_count"] == 2  # input fields are kept
    summary = json.loads((scored.parent / "scored.jsonl.summary.json").read_text())
    assert summary["prompts"] == 2 and summary["completions"] == 8
    assert summary["functions"]["exact_match"]["mean"] == 6 / 8
    assert summary["functions"]["exact_match"]["nan_count"] == 0
    assert summary["frac_zero_std_groups"] == 0.5
    assert abs(sum(summary["weight_effect"].values()) - 1) < 1e-9
    assert "grpo score" in result.stderr


def test_failing_function_is_masked_with_an_alert_and_its_fallback_takes_over(runs: tuple[Background, Path]) -> None:
    background, root = runs
    scored = root / "masked" / "scored.jsonl"
    result = background.result("failing_function_is_masked_with_an_alert_and_its_fallback_takes_over")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "broken" in result.stderr and "alert" in result.stderr.lower()
    summary = json.loads((root / "masked" / "scored.jsonl.summary.json").read_text())
    assert summary["masked_functions"] == ["broken"]
    assert len(summary["alerts"]) == 1
    assert summary["functions"]["broken"]["nan_count"] == 10
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert all(c["rewards"]["broken"] is None for r in rows for c in r["completions"])
    assert [c["reward"] for c in rows[-1]["completions"]] == [1.0, 0.0]


def test_bad_rollouts_file_names_file_and_line(runs: tuple[Background, Path]) -> None:
    background, root = runs
    rollouts, scored = root / "bad_line" / "rollouts.jsonl", root / "bad_line" / "scored.jsonl"
    result = background.result("bad_rollouts_file_names_file_and_line:bad_line")
    assert result.returncode != 0
    assert f"{rollouts}:2" in result.stderr and "Traceback" not in result.stderr
    assert not scored.exists()  # no half-written output under the final name
    result = background.result("bad_rollouts_file_names_file_and_line:missing")
    assert result.returncode != 0 and "missing.jsonl" in result.stderr


def test_mixed_group_sizes_are_refused(runs: tuple[Background, Path]) -> None:
    background, root = runs
    result = background.result("mixed_group_sizes_are_refused")
    assert result.returncode != 0
    assert f"{root / 'mixed' / 'rollouts.jsonl'}:2: 3 completions, expected 2" in result.stderr


def test_two_scorings_in_one_directory_keep_their_own_summaries(tmp_path: Path) -> None:
    """In process, through run_score as the CLI calls it: a second scoring here overwrote the first
    one's score_summary.json. Each summary is now named after its output; an existing one is refused."""
    from grpo_cli.commands.score import run_score
    from grpo_cli.config.schema import RewardFunctionConfig, ScoreConfig
    from grpo_cli.errors import GrpoError

    write_rollouts(tmp_path / "rollouts.jsonl", [("1+1=", "2", ["2", "3"]), ("2+2=", "4", ["4", "4"])])
    exact = ScoreConfig(input=str(tmp_path / "rollouts.jsonl"), output=str(tmp_path / "exact.jsonl"))
    lenient = ScoreConfig(input=exact.input, output=str(tmp_path / "lenient.jsonl"))
    lenient.reward.functions = [RewardFunctionConfig(name="partial", target="answer_partial_credit")]
    run_score(exact)
    run_score(lenient)
    summaries = {
        name: json.loads((tmp_path / f"{name}.jsonl.summary.json").read_text()) for name in ("exact", "lenient")
    }
    assert set(summaries["exact"]["functions"]) == {"exact_match", "partial_credit"}
    assert set(summaries["lenient"]["functions"]) == {"partial"}
    taken = ScoreConfig(
        input=exact.input, output=str(tmp_path / "third.jsonl"), summary=str(tmp_path / "exact.jsonl.summary.json")
    )
    with pytest.raises(
        GrpoError, match=r"^summary=.*exact\.jsonl\.summary\.json already exists: grpo score does not overwrite"
    ):
        run_score(taken)
    assert not (tmp_path / "third.jsonl").exists()  # refused before any work
