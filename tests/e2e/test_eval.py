"""`grpo eval` as a user relies on it: eval.json from the default run, known figures from a
hand-written rollouts file, a side-by-side comparison, and the same greedy figures as the
trainer's `train.eval_every` on the same checkpoint."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from grpo_cli.commands.eval import run_eval
from grpo_cli.config.schema import EvalConfig, RewardFunctionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.training import GRPOTrainer
from tests.conftest import run_grpo

FIGURES = ("accuracy", "reward/mean", "reward/exact_match/mean", "reward/partial_credit/mean")


def write_rollouts(path: Path, groups: list[tuple[str, str, list[tuple[str, int, str]]]]) -> Path:
    """One line per prompt, as `grpo rollout` writes it; stale `rewards` as a scored file carries."""
    with path.open("w") as handle:
        for prompt, answer, completions in groups:
            rows = [
                {"text": text, "token_count": n, "finish_reason": finish, "rewards": {"exact_match": 1.0}}
                for text, n, finish in completions
            ]
            handle.write(json.dumps({"prompt": prompt, "answer": answer, "completions": rows}) + "\n")
    return path


# 2 of 4, 0 of 4 and 4 of 4 right: accuracy 1/2, pass@2 = (1 − C(2,2)/C(4,2) + 0 + 1)/3 = 11/18
KNOWN = [
    ("1+1=", "2", [("2", 2, "stop"), ("3", 2, "stop"), ("2", 2, "stop"), ("22", 4, "length")]),
    ("2+2=", "4", [("5", 2, "stop"), ("44", 4, "length"), ("", 1, "stop"), ("x", 2, "stop")]),
    ("3+3=", "6", [("6", 2, "stop"), ("6", 2, "stop"), ("6", 2, "stop"), ("6", 2, "stop")]),
]


def exact_match_only(cfg: EvalConfig) -> EvalConfig:
    cfg.reward.functions = [RewardFunctionConfig(name="exact_match", target="exact_match", normalize="none")]
    return cfg


def test_default_eval_writes_eval_json(tmp_path: Path) -> None:
    cfg = EvalConfig()
    objective = run_eval(cfg, tmp_path)
    report = json.loads((tmp_path / "eval.json").read_text())
    g = cfg.rollout.num_generations
    assert report["split"] == "eval" and report["num_generations"] == g
    assert report["prompts"] == 10  # the held-out 10% of the 100 distinct a+b problems, as train splits them
    assert report["completions"] == 10 * g
    assert report["success_function"] == "exact_match" and report["success_threshold"] == 1.0
    for name in ("pass@1", "pass@5", "truncated/rate", *FIGURES):
        assert 0.0 <= report[name] <= 1.0, name
        if name in FIGURES or name == "truncated/rate":
            assert 0.0 <= report[f"greedy/{name}"] <= 1.0, name
    assert report["pass@1"] == pytest.approx(report["accuracy"])  # pass@1 is the success rate
    assert report["pass@1"] <= report["pass@5"]
    assert 1.0 <= report["length/mean"] <= cfg.rollout.max_new_tokens
    assert report["reward/mean"] == pytest.approx(
        (report["reward/exact_match/mean"] + report["reward/partial_credit/mean"]) / 2
    )
    assert objective == report["accuracy"]


def test_rollouts_file_gives_the_known_figures(tmp_path: Path) -> None:
    cfg = exact_match_only(EvalConfig())
    cfg.input = str(write_rollouts(tmp_path / "rollouts.jsonl", KNOWN))
    cfg.eval.k = [1, 2, 4]
    assert run_eval(cfg, tmp_path) == 0.5
    report = json.loads((tmp_path / "eval.json").read_text())
    assert (report["prompts"], report["num_generations"], report["completions"]) == (3, 4, 12)
    assert report["accuracy"] == report["pass@1"] == 0.5
    assert report["pass@2"] == pytest.approx(11 / 18)
    assert report["pass@4"] == pytest.approx(2 / 3)
    assert report["reward/mean"] == report["reward/exact_match/mean"] == 0.5  # rescored: stale rewards ignored
    assert report["length/mean"] == pytest.approx(27 / 12)
    assert report["truncated/rate"] == pytest.approx(2 / 12)
    assert not [k for k in report if k.startswith("greedy/")]  # no model, no greedy answers

    cfg.max_prompts, cfg.output, cfg.eval.k = 2, str(tmp_path / "first2.json"), [1]
    run_eval(cfg, tmp_path)
    first2 = json.loads((tmp_path / "first2.json").read_text())
    assert (first2["prompts"], first2["accuracy"]) == (2, 0.25)

    cfg.eval.k = [1, 5]
    with pytest.raises(GrpoError, match="eval.k has 5, more than the 4 completions per prompt"):
        run_eval(cfg, tmp_path)


def test_k_above_num_generations_and_a_missing_comparison_fail_before_any_work(tmp_path: Path) -> None:
    cfg = EvalConfig()
    cfg.rollout.num_generations = 4
    with pytest.raises(GrpoError, match=r"eval.k=\[1, 5\].*rollout.num_generations=4"):
        run_eval(cfg, tmp_path)
    cfg = EvalConfig()
    cfg.compare = str(tmp_path / "nowhere")
    with pytest.raises(GrpoError, match="compare=.*nowhere: no eval.json there"):
        run_eval(cfg, tmp_path)
    assert not (tmp_path / "tiny_model").exists()


def test_cli_compare_shows_both_runs_and_the_difference(tmp_path: Path) -> None:
    all_wrong = [(p, a, [("0", 2, "stop")] * 4) for p, a, _ in KNOWN]
    other = exact_match_only(EvalConfig())
    other.input, other.eval.k = str(write_rollouts(tmp_path / "wrong.jsonl", all_wrong)), [1, 2]
    run_eval(other, tmp_path / "before")
    rollouts = write_rollouts(tmp_path / "rollouts.jsonl", KNOWN)
    result = run_grpo(
        "eval",
        f"input={rollouts}",
        "reward=exact_match",
        "eval.k=[1,2]",
        "greedy=false",
        f"compare={tmp_path / 'before'}",
        f"hydra.run.dir={tmp_path / 'after'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "after" / "eval.json").read_text())["accuracy"] == 0.5
    assert "this run vs the other" in result.stderr
    assert f"other: {tmp_path / 'before' / 'eval.json'}\n" in result.stderr
    assert f"evaluated {rollouts}\n" in result.stderr
    comparison = result.stderr.split("this run vs the other")[1].splitlines()
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in comparison if line.startswith("│")]
    rows = {name: values for name, *values in cells}
    assert rows["accuracy"] == ["0.5000", "0.0000", "+0.5000"]
    assert rows["pass@2"] == [f"{11 / 18:.4f}", "0.0000", f"{11 / 18:+.4f}"]
    assert rows["prompts"] == ["3", "3", "+0"]


def test_train_eval_every_logs_what_grpo_eval_reports_on_the_checkpoint(tmp_path: Path) -> None:
    """One function behind both: the same checkpoint, split and greedy decoding give equal figures."""
    train_cfg = TrainConfig()
    train_cfg.train.steps, train_cfg.train.eval_every, train_cfg.train.prompts_per_step = 2, 2, 4
    train_cfg.rollout.num_generations = 4
    train_cfg.data.operations = ["+", "-", "*"]  # 300 distinct problems: 30 held out
    trainer = GRPOTrainer(train_cfg, tmp_path / "train")
    trainer.setup()
    history = trainer.train()
    checkpoint = trainer.save()
    trainer.cleanup()
    logged = {k.removeprefix("eval/"): v for k, v in history[-1].items() if k.startswith("eval/")}
    assert {"accuracy", "length/mean", "truncated/rate", *FIGURES} <= logged.keys()
    assert logged["reward/partial_credit/mean"] > 0  # a figure that says something, not all zeros

    cfg = EvalConfig()
    cfg.model.kind, cfg.model.path = "hf", str(checkpoint)
    cfg.data, cfg.rollout = copy.deepcopy(train_cfg.data), copy.deepcopy(train_cfg.rollout)
    cfg.eval.k = [1]
    run_eval(cfg, tmp_path / "eval")
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["prompts"] == 30
    greedy = {k.removeprefix("greedy/"): v for k, v in report.items() if k.startswith("greedy/")}
    assert greedy == logged
    assert not any(isinstance(v, float) and math.isnan(v) for v in greedy.values())


def test_code_eval_counts_a_task_solved_only_when_every_unit_passes(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from grpo_cli.commands.entry import register_schemas

    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="eval", overrides=["reward=code"]))  # as the CLI does
    asserts = ["assert sign(5) == 1", "assert sign(-3) == -1", "assert sign(0) == 0"]
    right, two_of_three, wrong = "    return (x > 0) - (x < 0)\n", "    return 1 if x > 0 else -1\n", "    return 7\n"
    groups = [[right, two_of_three, two_of_three, wrong], [two_of_three, two_of_three, wrong, wrong]]
    with (tmp_path / "rollouts.jsonl").open("w") as handle:
        for texts in groups:
            row = {"prompt": "def sign(x):\n", "entry_point": "sign", "reference": "def sign(x):\n" + right}
            row |= {"test_list": asserts, "completions": [{"text": t, "token_count": 8} for t in texts]}
            handle.write(json.dumps(row) + "\n")
    cfg.input, cfg.eval.k = str(tmp_path / "rollouts.jsonl"), [1, 4]
    run_eval(cfg, tmp_path)
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["success_function"] == "code_tests"  # reward=code lists it first
    # solved: 1 of 8 (2 of 3 units is not solved); pass@4 = (1 + 0) / 2
    assert report["accuracy"] == report["pass@1"] == 1 / 8 and report["pass@4"] == 0.5
    assert report["reward/code_tests/mean"] == pytest.approx((1 + 4 * 2 / 3) / 8)  # the dense fraction


def test_a_checkpoint_whose_weights_file_is_cut_short_is_one_line_naming_it(tmp_path: Path) -> None:
    trainer = GRPOTrainer(TrainConfig(), tmp_path / "train")
    trainer.cfg.train.steps, trainer.cfg.train.prompts_per_step, trainer.cfg.rollout.num_generations = 1, 2, 2
    trainer.setup()
    checkpoint = trainer.save()  # step 0: the starting weights, as a checkpoint
    trainer.cleanup()
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cfg = EvalConfig()
    cfg.model.kind, cfg.model.path = "hf", str(checkpoint)
    with pytest.raises(GrpoError) as refused:
        run_eval(cfg, tmp_path / "eval")
    message = str(refused.value)
    assert f"model.path={checkpoint}: {weights} cannot be read" in message and "\n" not in message, message
