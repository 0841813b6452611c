"""`grpo score` through the real CLI: the file contract, advantages, summary, failures."""

from __future__ import annotations

import json
import statistics
import textwrap

from tests.conftest import run_grpo


def write_rollouts(path, groups):
    with path.open("w") as handle:
        for prompt, answer, texts in groups:
            completions = [{"text": t, "token_count": len(t) + 1, "finish_reason": "stop"} for t in texts]
            handle.write(json.dumps({"prompt": prompt, "answer": answer, "completions": completions}) + "\n")


def test_score_writes_rewards_fused_reward_and_group_advantages(tmp_path):
    rollouts, scored = tmp_path / "rollouts.jsonl", tmp_path / "out" / "scored.jsonl"
    write_rollouts(rollouts, [("1+1=", "2", ["2", "3", "2", "22"]), ("2+2=", "4", ["4", "4", "4", "4"])])
    result = run_grpo("score", f"input={rollouts}", f"output={scored}", "reward=exact_match")
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
    summary = json.loads((scored.parent / "score_summary.json").read_text())
    assert summary["prompts"] == 2 and summary["completions"] == 8
    assert summary["functions"]["exact_match"]["mean"] == 6 / 8
    assert summary["functions"]["exact_match"]["nan_count"] == 0
    assert summary["frac_zero_std_groups"] == 0.5
    assert abs(sum(summary["weight_effect"].values()) - 1) < 1e-9
    assert "grpo score" in result.stderr


def test_failing_function_is_masked_with_an_alert_and_its_fallback_takes_over(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def broken(prompts, completions, **_):
            raise RuntimeError("grader offline")
    """)
    )
    rollouts, scored = tmp_path / "rollouts.jsonl", tmp_path / "scored.jsonl"
    write_rollouts(rollouts, [(f"{i}+0=", str(i), [str(i), "x"]) for i in range(5)])
    functions = (
        "[{name: broken, target: 'my_rewards:broken', weight: 2.0, fallback: exact},"
        " {name: exact, target: exact_match, weight: 1.0}]"
    )
    result = run_grpo(
        "score",
        f"input={rollouts}",
        f"output={scored}",
        f"reward.functions={functions}",
        "reward.max_consecutive_failures=3",
        "batch_size=1",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "broken" in result.stderr and "alert" in result.stderr.lower()
    summary = json.loads((tmp_path / "score_summary.json").read_text())
    assert summary["masked_functions"] == ["broken"]
    assert len(summary["alerts"]) == 1
    assert summary["functions"]["broken"]["nan_count"] == 10
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert all(c["rewards"]["broken"] is None for r in rows for c in r["completions"])
    assert [c["reward"] for c in rows[-1]["completions"]] == [1.0, 0.0]


def test_bad_rollouts_file_names_file_and_line(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(rollouts, [("1+1=", "2", ["2", "3"])])
    with rollouts.open("a") as handle:
        handle.write('{"prompt": "x", "completions": [\n')
    scored = tmp_path / "scored.jsonl"
    result = run_grpo("score", f"input={rollouts}", f"output={scored}", "reward=exact_match")
    assert result.returncode != 0
    assert f"{rollouts}:2" in result.stderr and "Traceback" not in result.stderr
    assert not scored.exists()  # no half-written output under the final name
    result = run_grpo("score", f"input={tmp_path / 'missing.jsonl'}", f"output={scored}")
    assert result.returncode != 0 and "missing.jsonl" in result.stderr


def test_mixed_group_sizes_are_refused(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(rollouts, [("1+1=", "2", ["2", "3"]), ("1+2=", "3", ["3", "3", "1"])])
    result = run_grpo("score", f"input={rollouts}", f"output={tmp_path / 's.jsonl'}", "reward=exact_match")
    assert result.returncode != 0
    assert f"{rollouts}:2: 3 completions, expected 2" in result.stderr
