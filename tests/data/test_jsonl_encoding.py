"""A data file that is not UTF-8: one line naming the file, line, byte and column, never a traceback."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_cli.data.jsonl import iter_jsonl
from grpo_cli.errors import GrpoError
from tests.conftest import Background, run_grpo

PROMPT = {"prompt": "1+1=", "answer": "2"}
GROUP = {"prompt": "1+1=", "answer": "2", "completions": [{"text": "2"}, {"text": "3"}]}


def write_latin1_on_line_3(path: Path, row: dict) -> Path:
    """Two good lines, then `row` with its prompt ending in the Latin-1 byte 0xe9 ("é")."""
    good = json.dumps(row).encode("utf-8") + b"\n"
    bad = json.dumps({**row, "prompt": "caf\u00e9"}, ensure_ascii=False).encode("latin-1") + b"\n"
    path.write_bytes(good + good + bad)
    return path


def test_latin1_byte_names_file_line_byte_and_column(tmp_path: Path) -> None:
    path = write_latin1_on_line_3(tmp_path / "data.jsonl", PROMPT)
    rows = iter_jsonl(path)
    assert [lineno for lineno, _ in (next(rows), next(rows))] == [1, 2]  # good lines stream out first
    with pytest.raises(GrpoError) as info:
        next(rows)
    # '{"prompt": "caf' is 15 characters, so the é is the 16th.
    assert str(info.value) == f"{path}:3: not UTF-8: byte 0xe9 at column 16 (save the file as UTF-8)"


def test_column_counts_characters_not_bytes(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    # "ü" is two bytes in UTF-8 but one column in an editor
    path.write_bytes('{"prompt": "ü'.encode() + b'\xe9"}\n')
    with pytest.raises(GrpoError, match=r":1: not UTF-8: byte 0xe9 at column 14 "):
        list(iter_jsonl(path))


def test_utf8_bom_is_skipped_and_utf8_text_kept(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [{"prompt": "café"}, {"prompt": "日本"}])
    path.write_bytes(codecs.BOM_UTF8 + body.encode("utf-8"))
    assert list(iter_jsonl(path)) == [(1, {"prompt": "café"}), (2, {"prompt": "日本"})]


def test_windows_line_endings_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\r\n  \r\n{"prompt": "b"}\r\n')
    assert list(iter_jsonl(path)) == [(1, {"prompt": "a"}), (4, {"prompt": "b"})]


def assert_one_line_error(result, path: Path) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert path.name in result.stderr and ":3:" in result.stderr and "0xe9" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, Path]]:
    """Both `grpo` runs at once: each pays seconds of start-up."""
    root = tmp_path_factory.mktemp("latin1")
    data = write_latin1_on_line_3(root / "data.jsonl", PROMPT)
    rollouts = write_latin1_on_line_3(root / "rollouts.jsonl", GROUP)
    cases = {
        "train_on_latin1_data_is_a_user_error": lambda: run_grpo(
            "train", "data=jsonl", f"data.path={data}", "debug=smoke", f"hydra.run.dir={root / 'run'}", timeout=300
        ),
        "score_on_latin1_input_is_a_user_error": lambda: run_grpo(
            "score", f"input={rollouts}", f"output={root / 'scored.jsonl'}", cwd=root, timeout=300
        ),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def test_train_on_latin1_data_is_a_user_error(runs: tuple[Background, Path]) -> None:
    background, root = runs
    assert_one_line_error(background.result("train_on_latin1_data_is_a_user_error"), root / "data.jsonl")


def test_score_on_latin1_input_is_a_user_error(runs: tuple[Background, Path]) -> None:
    background, root = runs
    assert_one_line_error(background.result("score_on_latin1_input_is_a_user_error"), root / "rollouts.jsonl")
    assert not (root / "scored.jsonl").exists()
