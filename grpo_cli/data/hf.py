"""`data=hf`: prompts kept the way TRL's users keep them, as Hugging Face `datasets`.

A parquet, CSV or JSON file, a directory `save_to_disk` wrote, a directory of data files, or a hub
data set already in the local `datasets` cache: each is opened by `datasets` itself (load_dataset,
load_from_disk), so it reads exactly what a TRL script would. One split is taken, and its rows go
through the same checks and shaping as a jsonl file's (grpo_cli/data/rows.py): everything after
the load is shared. Nothing contacts the hub: a hub id the cache lacks is one line saying so.
`datasets` (pyarrow, pandas) is imported only when a data set is opened: seconds no other run pays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_cli.config.schema import DataConfig
from grpo_cli.data.rows import prompt_rows
from grpo_cli.errors import GrpoError

BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}  # datasets'
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # datasets decompresses a data file with one of these suffixes
# What save_to_disk writes: a DatasetDict's index of splits, or one Dataset's state (load_from_disk reads either)
SAVED_MARKERS = ("dataset_dict.json", "state.json")


def _builder(path: Path) -> str | None:
    """The `datasets` builder for a data file, by its extension (prompts.jsonl.gz reads as json)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return BUILDERS.get(suffixes[-1]) if suffixes else None


def _looks_local(path: str) -> bool:
    """A path meant to be here (absolute, ./, ~, nested, or a data file's name) rather than a hub
    id (org/name): a typo in it is "no such file", not a hub lookup."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or _builder(Path(path)) is not None


def check_hf_path(path: str | None) -> None:
    """At start-up, before any model loads and without importing `datasets`: data.path is a readable
    data file, a directory, or has a hub id's form (looked up in the cache when the data loads)."""
    if not path:
        raise GrpoError(
            "data=hf needs data.path=FILE|DIR|HUB_ID (a data file, a datasets directory or a cached hub id)"
        )
    here = Path(path).expanduser()
    if here.is_dir():
        return
    if here.is_file():
        if _builder(here) is None:
            *most, last = BUILDERS
            raise GrpoError(
                f"data.path={path}: data=hf reads {', '.join(most)} or {last} files (each may be compressed: "
                f"{', '.join(COMPRESSIONS)}), or a directory"
            )
        return
    if here.exists():  # /dev/null, a pipe, a socket
        raise GrpoError(f"data.path={path}: not a regular file or a directory")
    if _looks_local(path):
        raise GrpoError(f"data.path={path}: no such file or directory")


@contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE for this call only, whatever the environment says: a hub id is read from the
    cache and nothing contacts the hub. `datasets` and huggingface_hub read the flag from their
    modules at call time (the environment only at import), so those are what is set and restored."""
    import datasets.config
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _open(cfg: DataConfig) -> Any:
    """The data set at data.path as `datasets` opens it: a DatasetDict of splits, or one Dataset."""
    import datasets

    path, here = str(cfg.path), Path(str(cfg.path)).expanduser()
    if cfg.subset is not None and here.exists():
        raise GrpoError(f"data.subset={cfg.subset!r}: read for a hub id only, and data.path={path} is here")
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # no bar redrawn into a log that is a file or a pipe
    try:
        with _offline():
            if here.is_dir() and any((here / marker).is_file() for marker in SAVED_MARKERS):
                return datasets.load_from_disk(str(here))
            if here.is_dir():
                return datasets.load_dataset(str(here))
            if here.is_file():
                return datasets.load_dataset(_builder(here), data_files=str(here))
            return _from_cache(path, cfg.subset)
    except GrpoError:
        raise
    except Exception as err:  # whatever datasets fails with reading the user's data is about that data
        cause = err.__cause__ or err  # DatasetGenerationError wraps what the reader said
        what = _builder(here) if here.is_file() else "a data set"
        said = " ".join(str(cause).split())  # one line, however many the reader's message has
        raise GrpoError(f"{path}: datasets cannot read it as {what}: {type(cause).__name__}: {said}") from None
    finally:
        if bars:
            datasets.enable_progress_bars()


def _from_cache(repo_id: str, subset: str | None) -> Any:
    """A hub data set from the local `datasets` cache (offline: load_dataset looks there first)."""
    import datasets

    try:
        return datasets.load_dataset(repo_id, subset)
    except (ConnectionError, FileNotFoundError):  # offline, not cached (DatasetNotFoundError is a FileNotFoundError)
        named = ", ".join(repr(a) for a in (repo_id, subset) if a is not None)
        raise GrpoError(
            f"data.path={repo_id}: no such file or directory here, and no data set of that id in the local datasets "
            f"cache ({datasets.config.HF_DATASETS_CACHE}): data=hf never downloads; fetch it once with python -c "
            f'"import datasets; datasets.load_dataset({named})", or save_to_disk it and give the directory'
        ) from None
    except ValueError as err:  # several configurations cached and none named, or one not cached
        # datasets' own lines name the configurations there are; its advice is in Python, ours is the key
        said = [line.strip() for line in str(err).splitlines() if line.strip()]
        said = [line for line in said if not line.startswith(("Please specify", "load_dataset("))]
        raise GrpoError(f"data.path={repo_id}: {'; '.join(said)} (set data.subset)") from None


def _split(dataset: Any, cfg: DataConfig) -> Any:
    """The split data.split names; a directory of one saved Dataset has no splits and is used whole."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        if cfg.split != DataConfig.split:  # set on purpose: it would be ignored
            raise GrpoError(f"data.split={cfg.split!r}: {cfg.path} holds one table (Dataset.save_to_disk), no splits")
        return dataset
    if cfg.split not in dataset:
        splits = ", ".join(dataset)
        raise GrpoError(f"data.split={cfg.split!r}: no such split in {cfg.path} (its splits: {splits})")
    return dataset[cfg.split]


def _check_columns(table: Any, cfg: DataConfig, source: str) -> None:
    """A missing prompt or answer column, named with the columns there are: a data set's columns
    are the same in every row, so this is said once rather than at row 1."""
    there = list(table.column_names)
    for key, column in (("prompt_field", cfg.prompt_field), ("answer_field", cfg.answer_field)):
        optional = key == "answer_field" and column == DataConfig.answer_field  # rows may have no answer
        if column not in there and not optional:
            raise GrpoError(
                f"data.{key}={column!r}: no column {column!r} in {cfg.path} (split {cfg.split}; "
                f"its columns: {', '.join(there)})"
            )


def _without_nulls(prompt: Any) -> Any:
    """Arrow stores a column of messages with every key any message has: drop the `None`s it adds
    (`name: None` on every message where one had a name), which a chat template would render."""
    if isinstance(prompt, list):
        return [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in prompt]
    return prompt


def read_hf_prompts(cfg: DataConfig) -> list[dict[str, Any]]:
    """The rows of data.split of the data set at data.path, as every data source's rows are."""
    table = _split(_open(cfg), cfg)
    source = f"{cfg.path} (split {cfg.split})"
    if table.num_rows == 0:
        raise GrpoError(f"{source}: no rows")
    _check_columns(table, cfg, source)
    rows = table.to_list()  # one Arrow conversion for the whole split, not a Python object per cell access
    for row in rows:
        row[cfg.prompt_field] = _without_nulls(row[cfg.prompt_field])
    located = ((f"{source} row {i}", row) for i, row in enumerate(rows, start=1))
    return prompt_rows(located, source, cfg.prompt_field, cfg.answer_field)
