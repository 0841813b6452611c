"""`data=hf`: prompts kept as TRL's users keep them, as Hugging Face `datasets` (issue 53 item 6).

Every format is written by `datasets` itself in a temporary directory and loaded through
`load_examples`, the function the trainer, `grpo rollout` and `grpo eval` call. The rows must be the
ones `data=jsonl` gives for the same data: one row path, one set of checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import datasets.config
import pytest
from datasets import Dataset, DatasetDict

from grpo_cli.commands.train import run_train
from grpo_cli.config.schema import DataConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.data import load_examples
from grpo_cli.errors import GrpoError
from grpo_cli.models import build_tiny_tokenizer
from grpo_cli.rollout.prompts import PromptEncoder
from tests.conftest import read_metrics, run_grpo

ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "level": a % 3} for a in range(12)]
CHAT = [
    {
        "prompt": [
            {"role": "system", "content": "Reply with a number."},
            {"role": "user", "content": f"What is {a} plus {a}?"},
        ],
        "answer": str(2 * a),
    }
    for a in range(12)
]
CHAT[0]["prompt"][1]["name"] = "ada"  # Arrow gives every other message of the column `name: None`


def columns(rows: list[dict]) -> dict[str, list]:
    return {key: [row[key] for row in rows] for key in rows[0]}


def hf(path: Path | str, **settings: object) -> DataConfig:
    return DataConfig(kind="hf", path=str(path), **settings)


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`load_dataset` converts a data file to Arrow in its cache: here, not in the user's home."""
    cache = tmp_path / "hf_datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


# ---- every format a `datasets` user keeps ----------------------------------------------------------
WRITERS = {
    "parquet": lambda ds, path: ds.to_parquet(path),
    "csv": lambda ds, path: ds.to_csv(path, index=False),
    "jsonl": lambda ds, path: ds.to_json(path, lines=True),
    "json": lambda ds, path: ds.to_json(path, lines=False),  # one JSON array
}


@pytest.mark.parametrize("suffix", list(WRITERS))
def test_each_data_file_format_gives_the_rows_jsonl_gives(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"prompts.{suffix}"
    WRITERS[suffix](Dataset.from_dict(columns(ROWS)), str(path))
    jsonl = tmp_path / "same.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    expected = ROWS if suffix != "csv" else [{**row, "answer": int(row["answer"])} for row in ROWS]  # CSV: untyped
    assert load_examples(hf(path)) == expected
    assert load_examples(DataConfig(kind="jsonl", path=str(jsonl))) == ROWS


def test_a_save_to_disk_dataset_and_each_split_of_a_dataset_dict(tmp_path: Path) -> None:
    Dataset.from_dict(columns(ROWS)).save_to_disk(tmp_path / "one")
    assert load_examples(hf(tmp_path / "one")) == ROWS
    splits = DatasetDict({"train": Dataset.from_dict(columns(ROWS[:8])), "test": Dataset.from_dict(columns(ROWS[8:]))})
    splits.save_to_disk(tmp_path / "two")
    assert load_examples(hf(tmp_path / "two")) == ROWS[:8]  # data.split defaults to train
    assert load_examples(hf(tmp_path / "two", split="test")) == ROWS[8:]
    with pytest.raises(GrpoError) as info:
        load_examples(hf(tmp_path / "two", split="validation"))
    assert str(info.value) == f"data.split='validation': no such split in {tmp_path / 'two'} (its splits: train, test)"


def test_a_directory_of_data_files_is_split_by_file_name(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    Dataset.from_dict(columns(ROWS[:8])).to_parquet(tmp_path / "data" / "train.parquet")
    Dataset.from_dict(columns(ROWS[8:])).to_parquet(tmp_path / "data" / "test.parquet")
    assert load_examples(hf(tmp_path / "data")) == ROWS[:8]
    assert load_examples(hf(tmp_path / "data", split="test")) == ROWS[8:]


def cache_as_downloaded(cache: Path, repo_id: str, config: str, rows: list[dict], work: Path) -> None:
    """The layout a download leaves in the datasets cache (CACHE/org___name/CONFIG/VERSION/COMMIT),
    written offline by datasets' own parquet builder."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    Dataset.from_dict(columns(rows)).to_parquet(work / f"{config}.parquet")
    name = repo_id.split("/")[1]
    builder = Parquet(
        cache_dir=str(work / "build"), dataset_name=name, config_name=config,
        data_files={"train": str(work / f"{config}.parquet")},
    )  # fmt: skip
    builder.download_and_prepare()
    shutil.move(builder.cache_dir, cache / repo_id.replace("/", "___") / config / "0.0.0" / "0123abcd")


def test_a_hub_id_is_read_from_the_datasets_cache_and_nothing_else(tmp_path: Path, datasets_cache: Path) -> None:
    cache_as_downloaded(datasets_cache, "grpo-test/tiny_prompts", "default", ROWS, tmp_path)
    offline = datasets.config.HF_HUB_OFFLINE
    assert load_examples(hf("grpo-test/tiny_prompts")) == ROWS
    assert datasets.config.HF_HUB_OFFLINE == offline  # offline for the call only
    with pytest.raises(GrpoError) as info:
        load_examples(hf("grpo-test/not_downloaded"))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(
        "data.path=grpo-test/not_downloaded: no such file or directory here, and no data set of that id in the "
        f"local datasets cache ({datasets_cache}): data=hf never downloads;"
    )


def test_a_hub_data_set_of_several_configurations_needs_data_subset(tmp_path: Path, datasets_cache: Path) -> None:
    """openai/gsm8k's shape: `main` and `socratic`, both cached."""
    cache_as_downloaded(datasets_cache, "grpo-test/gsm", "main", ROWS[:6], tmp_path)
    cache_as_downloaded(datasets_cache, "grpo-test/gsm", "socratic", ROWS[6:], tmp_path)
    assert load_examples(hf("grpo-test/gsm", subset="socratic")) == ROWS[6:]
    with pytest.raises(
        GrpoError, match=r"^data\.path=grpo-test/gsm: .*(main, socratic|socratic, main) \(set data\.subset\)$"
    ):
        load_examples(hf("grpo-test/gsm"))
    with pytest.raises(
        GrpoError, match=r"^data\.path=grpo-test/gsm: .*'other'.*\['main', 'socratic'\] \(set data\.subset\)$"
    ):
        load_examples(hf("grpo-test/gsm", subset="other"))


# ---- columns: the prompt, the answer, the rest for the rewards -----------------------------------
def test_columns_map_onto_the_prompt_and_the_answer_and_the_rest_reach_the_rewards(tmp_path: Path) -> None:
    rows = [{"question": r["prompt"], "solution": r["answer"], "level": r["level"]} for r in ROWS]
    Dataset.from_dict(columns(rows)).to_parquet(tmp_path / "qa.parquet")
    loaded = load_examples(hf(tmp_path / "qa.parquet", prompt_field="question", answer_field="solution"))
    # the answer rewards read `answer`; a TRL reward reading `solution` still finds it
    assert loaded == [
        {"prompt": r["prompt"], "solution": r["answer"], "level": r["level"], "answer": r["answer"]} for r in ROWS
    ]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"prompt_field": "question"}, "data.prompt_field='question': no column 'question' in {path} (split train; "
         "its columns: prompt, answer, level)"),
        ({"answer_field": "solution"}, "data.answer_field='solution': no column 'solution' in {path} (split train; "
         "its columns: prompt, answer, level)"),
    ],
)  # fmt: skip
def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path: Path, settings: dict, says: str) -> None:
    path = tmp_path / "rows.parquet"
    Dataset.from_dict(columns(ROWS)).to_parquet(path)
    with pytest.raises(GrpoError) as info:
        load_examples(hf(path, **settings))
    assert str(info.value) == says.format(path=path)


def test_a_second_prompt_or_answer_column_is_refused_not_silently_used(tmp_path: Path) -> None:
    path = tmp_path / "both.parquet"
    Dataset.from_dict({"question": ["1+1="], "prompt": ["2+2="], "answer": ["2"], "solution": ["2"]}).to_parquet(path)
    with pytest.raises(GrpoError, match=r"row 1: data\.prompt_field='question', and the row has a 'prompt' column"):
        load_examples(hf(path, prompt_field="question"))
    with pytest.raises(GrpoError, match=r"row 1: data\.answer_field='solution', and the row has an 'answer' column"):
        load_examples(hf(path, answer_field="solution"))


def test_the_jsonl_checks_apply_to_every_format(tmp_path: Path) -> None:
    """An answer no answer reward can match, an empty prompt: refused as for a jsonl file, naming the row."""
    path = tmp_path / "rows.parquet"
    Dataset.from_dict({"prompt": ["1+1=", "2+2="], "answer": ["2", None]}).to_parquet(path)
    with pytest.raises(GrpoError, match=rf"^{path} \(split train\) row 2: answer None is null: "):
        load_examples(hf(path))
    Dataset.from_dict({"prompt": ["1+1=", "  ", ""], "answer": ["2", "4", "6"]}).to_parquet(path)
    with pytest.raises(
        GrpoError, match=rf"^{path} \(split train\) row 2: empty prompt \(field 'prompt'\); 2 of 3 rows"
    ):
        load_examples(hf(path))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b"not parquet"), "{path}: datasets cannot read it as parquet: "),
        # datasets' own words for a parquet file of no rows ('Instruction "train" corresponds to no data!')
        (lambda p: Dataset.from_dict({"prompt": []}).to_parquet(p), "{path}: datasets cannot read it as parquet: "),
        # datasets 5.2 fails inside load_from_disk on a saved split of no rows (an IndexError)
        (lambda p: DatasetDict({"train": Dataset.from_dict({"prompt": []})}).save_to_disk(p), "{path}: datasets "),
    ],
    ids=["corrupt", "empty-file", "empty-split"],
)  # fmt: skip
def test_data_that_gives_no_rows_is_one_line_naming_it(tmp_path: Path, make: object, says: str) -> None:
    path = tmp_path / "bad.parquet"
    make(path)  # type: ignore[operator]
    with pytest.raises(GrpoError) as info:
        load_examples(hf(path))
    assert str(info.value).startswith(says.format(path=path)) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (None, "data=hf needs data.path=FILE|DIR|HUB_ID"),
        ("missing/prompts.parquet", "data.path=missing/prompts.parquet: no such file or directory"),
        ("./prompts", "data.path=./prompts: no such file or directory"),
        ("{tmp}/prompts.txt", "data.path={tmp}/prompts.txt: data=hf reads .parquet, .csv, .json, .jsonl or .arrow"),
    ],
)
def test_start_up_refuses_a_path_that_is_not_there(tmp_path: Path, path: str | None, says: str) -> None:
    """Before any model loads; a hub id is looked up in the cache when the data loads."""
    (tmp_path / "prompts.txt").write_text("1+1=\n")
    cfg = TrainConfig()
    cfg.data = hf(path.format(tmp=tmp_path)) if path else DataConfig(kind="hf")
    with pytest.raises(GrpoError, match="^" + says.format(tmp=tmp_path).replace(".", r"\.").replace("|", r"\|")):
        validate(cfg)


# ---- the conversational format ----------------------------------------------------------------------
def test_conversational_prompts_go_through_the_chat_template(tmp_path: Path) -> None:
    Dataset.from_dict(columns(CHAT)).to_parquet(tmp_path / "chat.parquet")
    examples = load_examples(hf(tmp_path / "chat.parquet"))
    assert [ex["prompt"] for ex in examples] == [ex["prompt"] for ex in CHAT]  # no `name: None` added
    tokenizer = build_tiny_tokenizer()
    ids, mask = PromptEncoder(tokenizer, 512, "cpu")([examples[1]["prompt"]])
    assert (
        tokenizer.decode(ids[0][mask[0].bool()]) == "system: Reply with a number.\nuser: What is 1 plus 1?\nassistant: "
    )


# ---- end to end -------------------------------------------------------------------------------------
def test_grpo_train_on_a_parquet_file(tmp_path: Path) -> None:
    """As a user types it, in a subprocess: the conf/data/hf.yaml option, the CLI, two steps."""
    Dataset.from_dict(columns(ROWS)).to_parquet(tmp_path / "prompts.parquet")
    run_dir = tmp_path / "run"
    proc = run_grpo(
        "train", "data=hf", f"data.path={tmp_path / 'prompts.parquet'}", "debug=smoke", f"hydra.run.dir={run_dir}",
        env={"HF_DATASETS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2]
    assert "reward/exact_match/mean" in read_metrics(run_dir)[0]  # the `answer` column reached the reward


def test_training_on_a_conversational_save_to_disk_dataset(tmp_path: Path) -> None:
    """In process, through run_train: a DatasetDict directory, its `train` split, chat prompts."""
    splits = DatasetDict({"train": Dataset.from_dict(columns(CHAT[:8])), "test": Dataset.from_dict(columns(CHAT[8:]))})
    splits.save_to_disk(tmp_path / "saved")
    cfg = TrainConfig()
    cfg.data = hf(tmp_path / "saved", eval_fraction=0.0)
    cfg.debug.smoke = True
    cfg.monitor.console, cfg.monitor.log_completions_every = "quiet", 1
    run_train(cfg, tmp_path / "run")
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2]
    logged = (tmp_path / "run" / "completions" / "step_000001.jsonl").read_text().splitlines()
    train_prompts = [ex["prompt"] for ex in CHAT[:8]]
    assert all(json.loads(line)["prompt"] in train_prompts for line in logged)
