"""eval.json lists what the model answered greedily, prompt by prompt, beside the figures it computes
from those answers: the getting-started page sends a user there to read them."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_cli.commands.eval import run_eval
from grpo_cli.config.schema import EvalConfig


def test_eval_json_lists_each_prompts_greedy_answer_after_the_figures(tmp_path: Path) -> None:
    cfg = EvalConfig()
    cfg.max_prompts, cfg.rollout.num_generations, cfg.eval.k = 6, 2, [1]
    run_eval(cfg, tmp_path)
    report = json.loads((tmp_path / "eval.json").read_text())
    answers = report["greedy_answers"]
    assert list(report)[-1] == "greedy_answers"  # the figures first, the long list last
    assert len(answers) == report["prompts"] == 6
    assert all("+" in a["prompt"] and a["prompt"].endswith("=") for a in answers)  # the split's own prompts
    assert all(isinstance(a["answer"], str) and set(a["rewards"]) == {"exact_match", "partial_credit"} for a in answers)
    # the answers are the ones the greedy figures were computed from
    solved = [a["rewards"]["exact_match"] >= 1.0 for a in answers]
    assert [a["solved"] for a in answers] == solved
    assert report["greedy/accuracy"] == sum(solved) / len(solved)
    assert report["greedy/reward/partial_credit/mean"] == sum(a["rewards"]["partial_credit"] for a in answers) / 6


def test_a_rollouts_file_has_no_greedy_answers_to_list(tmp_path: Path) -> None:
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "completions": [{"text": "2"}]}) + "\n")
    cfg = EvalConfig()
    cfg.input, cfg.greedy, cfg.rollout.num_generations, cfg.eval.k = str(rollouts), False, 1, [1]
    run_eval(cfg, tmp_path)
    assert "greedy_answers" not in json.loads((tmp_path / "eval.json").read_text())
