"""`grpo rollout`: the file `grpo score` reads, seeded, resumable after a SIGKILL, with its meta file.

Most runs call `run_rollout` in-process on the saved tiny model (the CLI composes onto the same
dataclass, which tests/config checks); the crash test runs the real CLI in a subprocess and kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_cli import __version__
from grpo_cli.commands.rollout import rollout_settings, run_rollout
from grpo_cli.commands.score import run_score
from grpo_cli.config.schema import RolloutRunConfig, ScoreConfig
from grpo_cli.data import load_examples, split_examples
from grpo_cli.errors import GrpoError
from tests.conftest import REPO, Background


def rollout_config(model_dir: Path, output: Path, **top: object) -> RolloutRunConfig:
    """The default run on the saved tiny model (loaded as any model directory is), with small
    sampling settings, on one thread as the tiny model gets by itself."""
    cfg = RolloutRunConfig(output=str(output), console="quiet", max_prompts=12, batch_size=5, threads=1)
    cfg.model.kind, cfg.model.path = "hf", str(model_dir)
    cfg.rollout.num_generations = 3
    cfg.rollout.max_new_tokens = 48
    for key, value in top.items():
        setattr(cfg, key, value)
    return cfg


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_file_is_what_score_reads(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "rollouts.jsonl"
    cfg = rollout_config(tiny_model_dir, output)
    objective = run_rollout(cfg, tmp_path)
    records = read_records(output)
    data = load_examples(cfg.data)
    assert [r["index"] for r in records] == list(range(12))  # 12 prompts, batches of 5, 5 and 2
    for record in records:
        assert {k: v for k, v in record.items() if k not in ("index", "completions")} == data[record["index"]]
        assert len(record["completions"]) == 3
        for completion in record["completions"]:
            assert set(completion) == {"text", "token_count", "finish_reason"}
            if completion["finish_reason"] == "length":  # cut: no EOS in max_new_tokens
                assert completion["token_count"] == 48
            else:  # EOS counted in token_count, as training counts it
                assert completion["finish_reason"] == "stop" and 1 <= completion["token_count"] <= 48
    reasons = {c["finish_reason"] for r in records for c in r["completions"]}
    assert reasons == {"stop", "length"}  # seeded: this run has both
    counts = [c["token_count"] for r in records for c in r["completions"]]
    assert objective == pytest.approx(sum(counts) / len(counts))

    scored = tmp_path / "scored.jsonl"
    mean_reward = run_score(ScoreConfig(input=str(output), output=str(scored)))
    rows = read_records(scored)
    assert [r["index"] for r in rows] == list(range(12))
    completions = [c for r in rows for c in r["completions"]]
    assert len(completions) == 12 * 3
    assert all(set(c["rewards"]) == {"exact_match", "partial_credit"} for c in completions)
    assert all(isinstance(c["reward"], float) and isinstance(c["advantage"], float) for c in completions)
    summary = json.loads((tmp_path / "scored.jsonl.summary.json").read_text())
    assert summary["prompts"] == 12 and summary["group_size"] == 3
    assert summary["reward"]["mean"] == pytest.approx(mean_reward)


def test_the_settings_name_a_hub_id_as_given_and_a_local_model_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume compares these: a hub id made absolute (CWD/ORG/NAME) would differ from every other directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)  # here, so not the hub's
    cfg = rollout_config(Path("models/mine"), tmp_path / "r.jsonl")
    assert rollout_settings(cfg, "fp32", [])["model"]["path"] == str(tmp_path / "models" / "mine")
    cfg.model.path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert rollout_settings(cfg, "fp32", [])["model"]["path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_resume_compares_what_was_sampled_not_how_the_server_is_reached(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A file written colocated continues against a vLLM server with the same sampling settings, and
    a file written before the server's and train's keys existed still resumes: they decide nothing
    the file holds. A sampling setting of the engine (its dtype) still does."""
    cfg = rollout_config(tiny_model_dir, tmp_path / "r.jsonl")
    cfg.rollout.backend = "vllm"
    colocated = rollout_settings(cfg, "fp32", [])
    cfg.rollout.vllm.mode, cfg.rollout.vllm.server_url = "server", "http://127.0.0.1:8000"
    cfg.rollout.vllm.call_timeout = 5.0
    assert rollout_settings(cfg, "fp32", []) == colocated
    assert "max_staleness" not in colocated["rollout"] and "server_url" not in colocated["rollout"]["vllm"]
    cfg.rollout.vllm.dtype = "bf16"
    assert rollout_settings(cfg, "fp32", []) != colocated


def test_same_seed_same_file_other_seed_other_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    files = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        cfg = rollout_config(tiny_model_dir, tmp_path / f"{name}.jsonl", seed=seed, max_prompts=4)
        cfg.rollout.max_new_tokens = 8
        run_rollout(cfg, tmp_path)
        files[name] = (tmp_path / f"{name}.jsonl").read_text()
    assert files["a"] == files["b"]
    assert files["a"] != files["c"]


def test_meta_file_records_what_made_the_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    cfg = rollout_config(tiny_model_dir, output, max_prompts=3, split="train")
    cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_k = 4, 0.7, 20
    run_rollout(cfg, tmp_path)
    meta = json.loads((tmp_path / "r.jsonl.meta.json").read_text())
    assert meta["grpo_version"] == __version__
    assert meta["settings"]["rollout"] == {
        "backend": "hf",
        "loop": "auto",
        "num_generations": 3,
        "max_new_tokens": 4,
        "min_new_tokens": 0,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 20,
        "min_p": None,
        "repetition_penalty": 1.0,
        "generation_kwargs": {},
        "sampling_weights": "auto",
    }
    assert meta["settings"]["model"]["path"] == str(tiny_model_dir.resolve())
    assert meta["settings"]["model"]["dtype"] == "fp32"  # model.dtype=auto: the default precision
    assert (meta["settings"]["split"], meta["settings"]["seed"], meta["settings"]["data"]["kind"]) == (
        "train",
        0,
        "arithmetic",
    )
    assert meta["prompts"] == 3 and meta["prompts_in_file"] == 3 and meta["complete"] is True
    assert not list(tmp_path.glob(".*partial"))  # written atomically, no temporary left


def test_an_existing_output_is_never_overwritten(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    output.write_text("precious\n")
    with pytest.raises(GrpoError, match=r"r\.jsonl already exists: add rollout\.resume=true"):
        run_rollout(rollout_config(tiny_model_dir, output), tmp_path)
    assert output.read_text() == "precious\n"


def test_a_data_column_named_like_a_record_field_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "index": 7}) + "\n")
    cfg = rollout_config(tiny_model_dir, tmp_path / "r.jsonl")
    cfg.data.kind, cfg.data.path = "jsonl", str(data)
    with pytest.raises(GrpoError, match="data row 0 has a column named 'index'"):
        run_rollout(cfg, tmp_path)


def test_resume_with_other_sampling_settings_names_the_keys(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    cfg = rollout_config(tiny_model_dir, output, max_prompts=2)
    cfg.rollout.max_new_tokens = 4
    run_rollout(cfg, tmp_path)
    before = output.read_text()
    cfg.rollout.resume, cfg.rollout.temperature, cfg.seed = True, 0.5, 3
    with pytest.raises(GrpoError, match=r"rollout\.temperature \(file 1\.0, now 0\.5\); seed \(file 0, now 3\)"):
        run_rollout(cfg, tmp_path)
    assert output.read_text() == before


def test_eval_split_is_the_trainers_held_out_split(tiny_model_dir: Path, tmp_path: Path) -> None:
    indices = {}
    for split in ("train", "eval"):
        cfg = rollout_config(tiny_model_dir, tmp_path / f"{split}.jsonl", split=split, max_prompts=0, batch_size=64)
        cfg.data.num_examples, cfg.data.eval_fraction = 40, 0.25
        cfg.rollout.num_generations, cfg.rollout.max_new_tokens = 1, 1
        run_rollout(cfg, tmp_path)
        indices[split] = [r["index"] for r in read_records(tmp_path / f"{split}.jsonl")]
    examples = load_examples(cfg.data)
    train, held_out = split_examples(examples, 0.25, cfg.data.seed)  # as GRPOTrainer.setup splits
    assert [examples[i] for i in indices["eval"]] == held_out and len(held_out) == 10
    assert [examples[i] for i in indices["train"]] == train


KILLED_TOTAL = 30  # prompts of the killed run: ~10 generate calls, a few seconds on a busy CPU
KILLED_SETTINGS = {"batch_size": 3, "rollout.num_generations": 2, "rollout.max_new_tokens": 32, "data.max_operand": 99}


def run_and_kill(model_dir: Path, root: Path) -> tuple[int, list[str], str]:
    """`grpo rollout` as a user runs it, SIGKILLed once its output has 3 lines; returns (exit
    status, the file's complete lines, stderr)."""
    output = root / "killed.jsonl"
    overrides = [f"{k}={v}" for k, v in KILLED_SETTINGS.items()]
    overrides += ["model=hf", f"model.path={model_dir}", "threads=1", f"output={output}", f"max_prompts={KILLED_TOTAL}"]
    overrides.append(f"hydra.run.dir={root}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli", "rollout", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while not (output.exists() and output.read_bytes().count(b"\n") >= 3):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.005)
    finally:
        process.kill()  # SIGKILL: no handler runs, nothing is flushed or closed
        _, stderr = process.communicate()
    lines = output.read_text().splitlines(keepends=True) if output.exists() else []
    return process.returncode, [line for line in lines if line.endswith("\n")], stderr.decode()[-3000:]


@pytest.fixture(scope="module", autouse=True)
def killed_run(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Background, Path]]:
    """Started with the module: its seconds of imports overlap the in-process tests."""
    root = tmp_path_factory.mktemp("killed")
    background = Background(
        request, {"killed_run_resumes_to_the_uninterrupted_file": lambda: run_and_kill(tiny_model_dir, root)}
    )
    yield background, root
    background.close()


def test_killed_run_resumes_to_the_uninterrupted_file(
    killed_run: tuple[Background, Path], tiny_model_dir: Path
) -> None:
    """Every finished prompt survives a SIGKILL; `rollout.resume=true` drops a half-written line,
    appends the rest, and the file equals an uninterrupted run's (batches reseed from their position)."""
    background, root = killed_run
    status, finished, stderr = background.result("killed_run_resumes_to_the_uninterrupted_file")
    assert status == -signal.SIGKILL, stderr
    assert 3 <= len(finished) < KILLED_TOTAL, "the kill must land mid-run"
    output = root / "killed.jsonl"
    with output.open("a") as handle:  # as if the kill had cut a write in half
        handle.write(finished[-1][: len(finished[-1]) // 2])
    meta = json.loads((root / "killed.jsonl.meta.json").read_text())
    assert meta["complete"] is False and meta["prompts"] == KILLED_TOTAL

    cfg = rollout_config(tiny_model_dir, output, max_prompts=KILLED_TOTAL, batch_size=KILLED_SETTINGS["batch_size"])
    cfg.rollout.num_generations = KILLED_SETTINGS["rollout.num_generations"]
    cfg.rollout.max_new_tokens = KILLED_SETTINGS["rollout.max_new_tokens"]
    cfg.data.max_operand = KILLED_SETTINGS["data.max_operand"]
    cfg.rollout.resume = True
    run_rollout(cfg, root)
    resumed = output.read_text().splitlines(keepends=True)
    assert resumed[: len(finished)] == finished  # the finished prompts' records, byte for byte
    assert sorted(json.loads(line)["index"] for line in resumed) == list(range(KILLED_TOTAL))  # each once
    assert json.loads((root / "killed.jsonl.meta.json").read_text())["complete"] is True

    cfg.output, cfg.rollout.resume = str(root / "straight.jsonl"), False
    run_rollout(cfg, root)
    assert resumed == (root / "straight.jsonl").read_text().splitlines(keepends=True)


def test_an_output_in_a_missing_directory_creates_it_as_score_and_eval_do(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "new" / "dir" / "rollouts.jsonl"
    run_rollout(rollout_config(tiny_model_dir, output), tmp_path / "run")
    assert len(read_records(output)) > 0


def test_an_output_under_a_file_is_one_line_naming_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("mine\n")
    with pytest.raises(GrpoError, match=r"^output=.*notes/r\.jsonl: cannot create its directory .*notes"):
        run_rollout(rollout_config(tiny_model_dir, tmp_path / "notes" / "r.jsonl"), tmp_path / "run")
    assert (tmp_path / "notes").read_text() == "mine\n"
