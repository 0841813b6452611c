"""Bad input gets one short message naming the culprit and a non-zero exit, before any model is
built; a traceback only with HYDRA_FULL_ERROR=1."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grpo_cli.commands.errors import report_user_errors
from grpo_cli.errors import GrpoError
from tests.conftest import Background, run_grpo

LONG_DIR = "a_directory_with_a_long_name_as_datasets_often_have_" + "x" * 40


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    malformed = root / "malformed.jsonl"
    malformed.write_text(
        '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3=", oops\n'
    )
    empty = root / "empty.jsonl"
    empty.write_text("")
    no_prompt = root / "no_prompt.jsonl"
    no_prompt.write_text('{"question": "1+1=", "answer": "2"}\n{"question": "2+2=", "answer": "4"}\n')
    recipes = root / "recipes"  # a user's primary config with a misspelled key
    recipes.mkdir()
    (recipes / "mine.yaml").write_text("defaults:\n  - train\n  - _self_\noptim:\n  lrr: 0.1\n")
    return {"root": root, "malformed": malformed, "empty": empty, "no_prompt": no_prompt, "recipes": recipes}


def _run(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> Callable[[], subprocess.CompletedProcess]:
    return lambda: run_grpo("train", *args, f"hydra.run.dir={run_dir}", env=env, timeout=300)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, files: dict[str, Path]) -> Iterator[Background]:
    root = files["root"]
    recipes = files["recipes"]
    cases = {
        "wrong_type": _run(root / "wrong_type", "train.steps=abc"),
        "bad_value": _run(root / "bad_value", "rollout.num_generations=1"),
        "bad_value_full_error": _run(
            root / "bad_value_full_error", "rollout.num_generations=1", env={"HYDRA_FULL_ERROR": "1"}
        ),
        "missing_model_dir": _run(root / "missing_model_dir", "model=hf", "model.path=/nonexistent"),
        "malformed_jsonl": _run(root / "malformed_jsonl", "data=jsonl", f"data.path={files['malformed']}"),
        "empty_jsonl": _run(root / "empty_jsonl", "data=jsonl", f"data.path={files['empty']}"),
        "jsonl_without_prompt_field": _run(
            root / "jsonl_without_prompt_field", "data=jsonl", f"data.path={files['no_prompt']}"
        ),
        "missing_tracker_package": _run(root / "missing_tracker_package", "monitor.trackers=[wandb]"),
        # refused before Hydra composes: seconds each all the same (a Python start, Hydra's import)
        "unknown_key_suggests_the_nearest": _run(root / "unknown_key", "optim.lrr=1"),
        "unknown_key_with_plus_is_refused": _run(root / "unknown_key_with_plus", "+optim.foo=1"),
        "unknown_key_with_plus_and_a_typo_suggests": _run(root / "unknown_key_with_plus_typo", "+algo.betta=0.1"),
        "typo_in_a_recipe_names_the_file_and_the_key_meant": _run(
            root / "recipe_typo", "--config-dir", str(recipes), "-cn", "mine"
        ),
    }
    background = Background(request, cases)
    yield background
    background.close()


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in stderr:\n{result.stderr[-3000:]}"


def assert_no_model_built(run_dir: Path) -> None:
    assert not (run_dir / "tiny_model").exists(), "the error came after a model was built"
    assert not (run_dir / "checkpoints").exists()


# ---- refused before Hydra composes (fast: no torch import) ----------------------------------------
def test_unknown_key_suggests_the_nearest(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("unknown_key_suggests_the_nearest")
    assert_user_error(result, "optim.lrr", "optim.lr")
    assert "did you mean optim.lr" in result.stderr
    assert not (files["root"] / "unknown_key").exists()


def test_unknown_key_with_plus_is_refused(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("unknown_key_with_plus_is_refused")
    assert_user_error(result, "optim.foo")
    assert not (files["root"] / "unknown_key_with_plus").exists()


def test_unknown_key_with_plus_and_a_typo_suggests(runs: Background) -> None:
    result = runs.result("unknown_key_with_plus_and_a_typo_suggests")
    assert_user_error(result, "algo.betta", "algo.beta")


# ---- refused after composing, before any model is built --------------------------------------------
def test_wrong_type(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("wrong_type")
    assert_user_error(result, "train.steps", "abc")
    assert_no_model_built(files["root"] / "wrong_type")


def test_bad_value(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("bad_value")
    assert_user_error(result, "rollout.num_generations=1")
    assert_no_model_built(files["root"] / "bad_value")


def test_bad_value_full_error(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("bad_value_full_error")
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "rollout.num_generations" in result.stderr
    assert_no_model_built(files["root"] / "bad_value_full_error")


def test_missing_model_dir(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("missing_model_dir")
    assert_user_error(result, "/nonexistent")
    assert_no_model_built(files["root"] / "missing_model_dir")


def test_malformed_jsonl(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("malformed_jsonl")
    assert_user_error(result, f"{files['malformed']}:3")
    assert_no_model_built(files["root"] / "malformed_jsonl")


def test_empty_jsonl(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("empty_jsonl")
    assert_user_error(result, str(files["empty"]), "empty")
    assert_no_model_built(files["root"] / "empty_jsonl")


def test_jsonl_without_prompt_field(runs: Background, files: dict[str, Path]) -> None:
    result = runs.result("jsonl_without_prompt_field")
    assert_user_error(result, f"{files['no_prompt']}:1", "prompt")
    assert "data.prompt_field" in " ".join(result.stderr.split())
    assert_no_model_built(files["root"] / "jsonl_without_prompt_field")


def test_missing_tracker_package_names_the_extra_before_any_model_loads(
    runs: Background, files: dict[str, Path]
) -> None:
    """wandb is not installed here (nor in CI): the error names the key, with its brackets, and the extra."""
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    assert_user_error(
        runs.result("missing_tracker_package"), "monitor.trackers=[wandb]", 'pip install "grpo-cli[wandb]"'
    )
    assert_no_model_built(files["root"] / "missing_tracker_package")


def test_long_path_is_not_wrapped(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, through the same reporter `grpo` uses: a subprocess would add seconds of import."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("COLUMNS", "80")  # what rich uses when stderr is a pipe and COLUMNS is unset
    path = f"/data/{LONG_DIR}/malformed.jsonl"

    def load() -> None:
        raise GrpoError(f"{path}:3: malformed JSON: Expecting value (column 12)")

    with pytest.raises(SystemExit) as exit_info:
        report_user_errors(load)
    assert exit_info.value.code != 0
    assert f"{path}:3" in capsys.readouterr().err


def test_typo_in_a_recipe_names_the_file_and_the_key_meant(runs: Background, files: dict[str, Path]) -> None:
    """A misspelled key inside a user's primary config gets the same did-you-mean as an override."""
    result = runs.result("typo_in_a_recipe_names_the_file_and_the_key_meant")
    assert result.returncode != 0
    mine = files["recipes"] / "mine.yaml"
    assert f"{mine}: unknown config key optim.lrr; did you mean optim.lr?" in result.stderr
    assert "Traceback" not in result.stderr
