"""Every config option under conf/ and every recipe composes, converts to the schema and validates;
every recipe runs end to end in smoke mode.

Files are discovered on disk, so a new option or recipe is tested without editing this file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from grpo_cli.commands.entry import register_schemas
from grpo_cli.config import TrainConfig
from grpo_cli.config.dotted import flatten
from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import CheckConfig, EvalConfig, ExportConfig, RolloutRunConfig, ScoreConfig
from grpo_cli.config.smoke import apply_smoke
from grpo_cli.config.train_checks import validate
from grpo_cli.rewards import resolve_reward_sources
from tests.conftest import REPO, read_metrics, run_grpo

CONF = REPO / "conf"
RECIPES = REPO / "recipes"
TRAIN_SUBCOMMAND = "train"


def _yaml_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if "__pycache__" not in p.parts)


def _group_options() -> list[tuple[str, str]]:
    """(group, option) for every file in a conf/ subdirectory, nested groups included."""
    options = []
    for path in _yaml_files(CONF):
        rel = path.relative_to(CONF)
        if len(rel.parts) < 2 or rel.parts[0] == "hydra":
            continue
        options.append((rel.parent.as_posix(), rel.stem))
    return options


def _conf_primaries() -> list[str]:
    return [p.stem for p in _yaml_files(CONF) if p.parent == CONF]


def _extends(path: Path) -> list[str]:
    """Plain entries of a config's defaults list, e.g. ['train'] for a recipe on train."""
    raw = OmegaConf.to_container(OmegaConf.load(path))
    defaults = raw.get("defaults", []) if isinstance(raw, dict) else []
    return [d.lstrip("/") for d in defaults if isinstance(d, str)]


ACCELERATE_CONFIGS = RECIPES / "accelerate"  # accelerate launch configs, not Hydra configs


def _recipes() -> list[str]:
    """Config names (relative to recipes/, no suffix) of every Hydra yaml below recipes/."""
    return [
        p.relative_to(RECIPES).with_suffix("").as_posix()
        for p in _yaml_files(RECIPES)
        if ACCELERATE_CONFIGS not in p.parents
    ]


@pytest.mark.parametrize("path", sorted(ACCELERATE_CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_load_as_data_parallel(path: Path) -> None:
    """What `accelerate launch --config_file` reads; DDP, the one layout grpo trains (FSDP and
    DeepSpeed shard the weights sampling needs whole, and the trainer refuses them)."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert config.distributed_type.name == "MULTI_GPU"
    assert config.num_processes >= 2 and config.mixed_precision == "no"


def _recipe_kind(name: str) -> str:
    """'train' for a primary config on train, 'other' for one on another subcommand's config,
    'option' for a group option that recipes select (a file in a recipes/ subdirectory)."""
    path = RECIPES / f"{name}.yaml"
    bases = _extends(path)
    if TRAIN_SUBCOMMAND in bases:
        return "train"
    if any(base in _conf_primaries() for base in bases):
        return "other"
    return "option" if "/" in name else "unknown"


@pytest.fixture(autouse=True, scope="module")
def _schemas() -> None:
    register_schemas()


@pytest.fixture
def prompts_jsonl(tmp_path: Path) -> Path:
    """A small jsonl with the columns the built-in rewards read."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)),
        encoding="utf-8",
    )
    return path


def _fill_paths(cfg: DictConfig, model_dir: Path, data_file: Path) -> None:
    """Options that need a path on disk (model=hf, data=jsonl, data=hf) get a real one."""

    def absent(node: DictConfig, check: str) -> bool:
        if OmegaConf.is_missing(node, "path") or node.path is None:
            return True
        return not getattr(Path(node.path), check)()

    if cfg.model.kind == "hf" and absent(cfg.model, "is_dir"):
        cfg.model.path = str(model_dir)
    if cfg.data.kind in ("jsonl", "hf") and absent(cfg.data, "is_file"):  # data=hf reads a jsonl file too
        cfg.data.path = str(data_file)


def _to_schema_and_validate(cfg: DictConfig) -> TrainConfig:
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig)
    if obj.debug.smoke:
        apply_smoke(obj)  # as `grpo train` does before validating
    warnings = validate(obj)
    assert all(isinstance(w, str) for w in warnings)
    return obj


# ---- compose ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _conf_primaries())
def test_conf_primary_config_composes_and_validates(name: str, tiny_model_dir: Path, prompts_jsonl: Path) -> None:
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = compose(config_name=name)
    if name == "score":
        score = OmegaConf.to_object(cfg)
        assert isinstance(score, ScoreConfig)
        assert score.reward.functions, "grpo score needs a default reward"
        assert resolve_reward_sources(score.reward.functions)
        return
    if name == "export":  # paths only: nothing to validate before they are given
        assert OmegaConf.to_object(cfg) == ExportConfig()
        return
    if name == "check":  # the model group alone: the tiny default until model=hf model.path=DIR
        assert OmegaConf.to_object(cfg) == CheckConfig()
        return
    if name == "rollout":
        rollout = OmegaConf.to_object(cfg)
        assert isinstance(rollout, RolloutRunConfig)
        validate_rollout(rollout)
        return
    if name == "eval":
        evaluation = OmegaConf.to_object(cfg)
        assert isinstance(evaluation, EvalConfig)
        validate_eval(evaluation)
        return
    assert name == TRAIN_SUBCOMMAND, f"conf/{name}.yaml: a primary config this test does not know"
    _fill_paths(cfg, tiny_model_dir, prompts_jsonl)
    _to_schema_and_validate(cfg)


@pytest.mark.parametrize(("group", "option"), _group_options(), ids=[f"{g}/{o}" for g, o in _group_options()])
def test_conf_option_composes_and_validates(group: str, option: str, tiny_model_dir: Path, prompts_jsonl: Path) -> None:
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = compose(config_name=TRAIN_SUBCOMMAND, overrides=[f"{group}={option}"])

    # The option's own values are what the composed config holds (no later default overrides them).
    source = CONF / group / f"{option}.yaml"
    if not source.read_text().lstrip().startswith("# @package"):
        values = OmegaConf.to_container(OmegaConf.load(source))
        values.pop("defaults", None)
        selected = OmegaConf.to_container(OmegaConf.select(cfg, group.replace("/", ".")))
        for key, expected in flatten(values).items():
            if expected == "???":
                continue
            assert OmegaConf.select(OmegaConf.create(selected), key) == expected, f"{group}={option}: {key}"

    _fill_paths(cfg, tiny_model_dir, prompts_jsonl)
    _to_schema_and_validate(cfg)


@pytest.mark.parametrize("name", _recipes())
def test_recipe_composes_and_validates(name: str, tiny_model_dir: Path, prompts_jsonl: Path) -> None:
    kind = _recipe_kind(name)
    if kind == "other":
        pytest.skip(f"recipes/{name}.yaml extends another subcommand's config")
    assert kind != "unknown", f"recipes/{name}.yaml extends no primary config (add `defaults: [train, _self_]`)"
    # Like `grpo train --config-dir recipes`: recipes first, the packaged configs behind them.
    with initialize_config_dir(str(RECIPES), version_base=None):
        searchpath = ["hydra.searchpath=[pkg://grpo_cli.conf]"]
        if kind == "train":
            cfg = compose(config_name=name, overrides=searchpath)
        else:
            group, option = name.rsplit("/", 1)
            cfg = compose(config_name=TRAIN_SUBCOMMAND, overrides=[*searchpath, f"{group}={option}"])
    _fill_paths(cfg, tiny_model_dir, prompts_jsonl)
    _to_schema_and_validate(cfg)


# ---- smoke runs ----------------------------------------------------------------------------------
def _smoke_data_override(name: str, tmp_path: Path) -> list[str]:
    """A recipe whose jsonl is not on this machine gets a small file with the columns its
    rewards need (dataset columns reach reward functions as keyword arguments)."""
    from grpo_cli.rewards import required_columns, resolve_reward_sources

    with initialize_config_dir(str(RECIPES), version_base=None):
        cfg = compose(config_name=name, overrides=["hydra.searchpath=[pkg://grpo_cli.conf]"])
    if cfg.data.kind != "jsonl":
        return []
    if not OmegaConf.is_missing(cfg.data, "path") and cfg.data.path and (REPO / str(cfg.data.path)).is_file():
        return []
    obj = OmegaConf.to_object(cfg)
    columns: set[str] = set()
    for fn in resolve_reward_sources(obj.reward.functions):
        columns.update(c for c in required_columns(fn.fn) if c not in fn.kwargs)
    path = tmp_path / "smoke_prompts.jsonl"
    rows = []
    for i in range(8):
        row: dict[str, Any] = {obj.data.prompt_field: f"{i}+{i}="}
        row.update({c: str(2 * i) for c in sorted(columns)})
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return [f"data.path={path}"]


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Future]]]:
    """Every train recipe's smoke run, two at a time: each pays seconds of torch import, and one
    process of the tiny model leaves the other core idle."""
    with ThreadPoolExecutor(2) as pool:
        runs = {}
        for name in (n for n in _recipes() if _recipe_kind(n) == "train"):
            tmp = tmp_path_factory.mktemp(name)
            args = ["--config-dir", str(RECIPES), "-cn", name, "debug=smoke", "train.threads=1"]
            args += [*_smoke_data_override(name, tmp), f"hydra.run.dir={tmp / 'run'}"]
            runs[name] = (tmp / "run", pool.submit(run_grpo, "train", *args, timeout=300))
        yield runs


@pytest.mark.parametrize("name", _recipes())
def test_recipe_runs_in_smoke_mode(name: str, smoke_runs: dict[str, tuple[Path, Future]]) -> None:
    if _recipe_kind(name) != "train":
        pytest.skip(f"recipes/{name}.yaml is not a primary config on train")
    run_dir, future = smoke_runs[name]  # "train.threads=1": the tiny model is faster on one thread
    result = future.result()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.model.kind == "tiny" and saved.train.steps == 2  # smoke won over the recipe
    assert len(read_metrics(run_dir)) == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2

    checkpoint = Path(summary["final_checkpoint"])
    assert checkpoint.is_dir() and checkpoint.parent.parent == run_dir
    assert (checkpoint / "trainer_state.json").is_file()
    from transformers import AutoModelForCausalLM

    from grpo_cli.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    batch = tokenizer(["1+1="], return_tensors="pt")
    logits = model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape and logits.isfinite().all()
