"""`grpo score` scores a file the way training scores a batch: the same RewardBatch, the same
score_and_fuse (a masked function is not called again), lengths in tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from grpo_cli.commands.entry import register_schemas
from grpo_cli.commands.score import run_score
from grpo_cli.config.schema import RewardFunctionConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import RewardExecutor, RewardFusion, RewardSource, resolve_reward_sources
from grpo_cli.scoring import score_rollouts_file


def write_rollouts(path: Path, token_counts: bool = True) -> Path:
    rows = []
    for a in range(3):
        completions = [{"text": text, "finish_reason": "stop"} for text in (str(a + 1), "x" * 40)]
        if token_counts:
            for c, n in zip(completions, (2, 11)):
                c["token_count"] = n
        rows.append({"prompt": f"{a}+1=", "answer": str(a + 1), "completions": completions})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_masked_function_is_not_called_again(tmp_path: Path) -> None:
    calls = []

    def broken(prompts, completions, **_):
        calls.append(len(completions))
        raise RuntimeError("reward server down")

    (exact,) = resolve_reward_sources([RewardFunctionConfig(name="exact", target="exact_match")])
    fusion = RewardFusion([exact, RewardSource("broken", broken, fallback="exact")], max_consecutive_failures=1)
    with RewardExecutor(0, None) as executor:
        summary = score_rollouts_file(
            write_rollouts(tmp_path / "in.jsonl"), tmp_path / "out.jsonl", fusion, executor, batch_size=1
        )
    assert calls == [2]  # masked after the first batch of one prompt; the other two never call it
    assert summary["masked_functions"] == ["broken"] and summary["functions"]["broken"]["nan_count"] == 6
    assert summary["reward"]["mean"] == pytest.approx(0.5)  # its weight went to `exact`


def overlong_sources():
    spec = RewardFunctionConfig(name="overlong", target="overlong", kwargs={"max_length": 10, "buffer": 4})
    return resolve_reward_sources([spec])


def test_lengths_are_the_files_token_counts(tmp_path: Path) -> None:
    with RewardExecutor(0, None) as executor:
        score_rollouts_file(
            write_rollouts(tmp_path / "in.jsonl"),
            tmp_path / "out.jsonl",
            RewardFusion(overlong_sources()),
            executor,
        )
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    # 2 tokens: no penalty; 11 tokens with L=10: past the limit, -1 (40 characters would say the same
    # only by accident: characters are not tokens).
    assert [c["rewards"]["overlong"] for c in rows[0]["completions"]] == [0.0, -1.0]


def test_a_length_reward_without_token_counts_needs_a_tokenizer(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = write_rollouts(tmp_path / "in.jsonl", token_counts=False)
    with RewardExecutor(0, None) as executor, pytest.raises(GrpoError, match=r"in\.jsonl:1: completion 0 has no"):
        score_rollouts_file(source, tmp_path / "out.jsonl", RewardFusion(overlong_sources()), executor)
    assert not (tmp_path / "out.jsonl").exists()

    # `grpo score ... tokenizer=DIR` counts them: composed as the CLI composes it, run in process through
    # the command's own function (the CLI's part, the file contract, is tests/e2e/test_score.py's)
    args = ["reward=overlong", f"input={source}", f"output={tmp_path / 'out.jsonl'}", f"tokenizer={tiny_model_dir}"]
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="score", overrides=args))
    run_score(cfg)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows[0]["completions"][0]["rewards"]["overlong"] is not None
