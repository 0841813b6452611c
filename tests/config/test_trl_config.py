"""`grpo train trl_config=FILE` and `algo=trl_defaults`: a TRL GRPOConfig file runs the settings a
hand-written grpo command line would, a field with no equivalent says so, a bad file stops naming
the field, and the preset is TRL's defaults (grpo_cli/config/trl/mapping.py, the one mapping)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from grpo_cli.commands.entry import register_schemas
from grpo_cli.commands.trl_config import expand_trl_config, hydra_value
from grpo_cli.config.dotted import flatten
from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.keys import check_key
from grpo_cli.config.schema import TrainConfig
from grpo_cli.config.trl.convert import convert
from grpo_cli.config.trl.mapping import FIELDS
from grpo_cli.errors import GrpoError
from tests.conftest import REPO, run_grpo
from tests.docs.test_coming_from_trl import SMOLLM2_ARGS, SMOLLM2_EXAMPLE


@cache
def _vs_trl() -> Any:
    """benchmarks/vs_trl.py, which is no package: the settings it hands each framework."""
    spec = importlib.util.spec_from_file_location("vs_trl", REPO / "benchmarks" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _trl_defaults() -> dict[str, Any]:
    """The installed TRL's GRPOConfig field defaults (the class's, without its __post_init__)."""
    trl = pytest.importorskip("trl", reason="pip install 'grpo-cli[bench]'")
    defaults = {}
    for field in dataclasses.fields(trl.GRPOConfig):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def _composed(overrides: list[str]) -> TrainConfig:
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=overrides))
    assert isinstance(cfg, TrainConfig)
    return cfg


def _write(tmp_path: Path, fields: dict[str, Any], name: str = "grpo_config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(fields) if name.endswith(".json") else yaml.safe_dump(fields, sort_keys=False))
    return path


def _expand(path: Path, *argv: str) -> tuple[list[str], str]:
    out = io.StringIO()
    return expand_trl_config([f"trl_config={path}", *argv], out), out.getvalue()


def _same_fusion(cfg: TrainConfig) -> dict[str, Any]:
    """The config with reward weights divided by their sum: weighted_mean fuses by the weights'
    ratios, so TRL's reward_weights 0.5/0.5 and grpo's default 1/1 are the same reward."""
    total = sum(f.weight for f in cfg.reward.functions)
    for function in cfg.reward.functions:
        function.weight /= total
    return dataclasses.asdict(cfg)


WORKLOADS = [("tiny", False), ("tiny", True), ("small", False), ("smollm2", False)]


@pytest.mark.parametrize(("workload", "identical_work"), WORKLOADS, ids=lambda x: str(x))
def test_the_vs_trl_workload_resolves_to_the_benchmarks_grpo_config(
    workload: str, identical_work: bool, tmp_path: Path
) -> None:
    """What benchmarks/vs_trl.py hands TRL, kept as a user keeps a GRPOConfig, composes to the
    config it hands grpo. The command line adds what GRPOConfig has no field for: the model
    (a GRPOTrainer argument), the data and rewards (a dataset and reward_funcs there), the threads,
    and what samples (TRL's generate decodes the policy itself: the benchmark's same-work setting)."""
    _trl_defaults()  # skips without TRL: trl_kwargs reads GRPOConfig's fields
    bench = _vs_trl()
    spec = bench.RunSpec(
        framework="trl",
        workload=bench.WORKLOADS[workload],
        seed=3,
        steps=20,
        threads=2,
        identical_work=identical_work,
        model_dir=str(tmp_path / "model"),
        run_dir=str(tmp_path / "run"),
        out=str(tmp_path / "out.json"),
    )
    path = _write(tmp_path, bench.trl_kwargs(spec))
    w = spec.workload
    own = ["model=hf", f"model.path={spec.model_dir}", f"train.threads={spec.threads}", "monitor.plots=false"]
    own.append(f"rollout.sampling_weights={spec.grpo_sampling}")
    if workload == "smollm2":
        own += [f"data.max_operand={w.max_operand}", f"data.template={hydra_value(w.template)}", "data.chat=true"]
        own += ["reward=last_number", "reward.functions.0.normalize=none"]
    overrides, _ = _expand(path, *own)
    assert f"hydra.run.dir={tmp_path / 'run' / 'trl_output'}" in overrides  # output_dir: the run directory
    cfg = _composed([arg for arg in overrides if not arg.startswith("hydra.")])
    assert _same_fusion(cfg) == _same_fusion(bench.grpo_config(spec))


def test_every_field_records_the_installed_trls_default() -> None:
    """The defaults a file's missing fields are read at (trl_config converts without TRL)."""
    installed = _trl_defaults()
    wrong = {n: (f.default, installed[n]) for n, f in FIELDS.items() if n in installed and f.default != installed[n]}
    assert not wrong, f"TRL's defaults moved (recorded, installed): {wrong}"


def test_algo_trl_defaults_is_grpo_configs_defaults() -> None:
    """Every algo key TRL's defaults map to, read from the installed TRL through the mapping, is the
    preset's value: a TRL release that changes one, or a knob mapped later, fails here."""
    installed = _trl_defaults()
    expected = convert({n: installed[n] for n in FIELDS if n in installed}).overrides
    algo = {key: value for key, value in expected.items() if key.startswith("algo.")}
    assert {"algo.loss_type", "algo.kl_ratio_correction", "algo.rollout_correction.mode"} <= set(algo)
    composed = flatten(dataclasses.asdict(_composed(["algo=trl_defaults"])))
    assert {key: composed[key] for key in algo} == algo
    # and the default preset differs from it where the page says ours differ
    ours = flatten(dataclasses.asdict(TrainConfig()))
    differ = sorted(key for key in algo if ours[key] != algo[key])
    assert differ == [
        "algo.kl_ratio_correction",
        "algo.loss_type",
        "algo.rollout_correction.cap",
        "algo.rollout_correction.mode",
    ]


def test_a_field_with_no_equivalent_prints_one_line_naming_it(tmp_path: Path) -> None:
    fields = {"loss_type": "dapo", "push_to_hub": True, "vllm_group_port": 51217, "dataloader_num_workers": 4}
    overrides, printed = _expand(_write(tmp_path, fields, "grpo_config.json"))
    assert overrides == ["algo.loss_type=dapo"]
    lines = printed.splitlines()
    assert lines[1] == "  grpo train algo.loss_type=dapo"  # the equivalent command line
    for name, why in [("push_to_hub", "Hub"), ("vllm_group_port", "NCCL"), ("dataloader_num_workers", "DataLoader")]:
        mine = [line for line in lines if line.startswith(f"  {name}: no equivalent in grpo: ")]
        assert len(mine) == 1 and why in mine[0], printed


def _server_keys(cfg: TrainConfig) -> tuple[str, str, str, float]:
    return cfg.rollout.backend, cfg.rollout.vllm.mode, cfg.rollout.vllm.server_url, cfg.rollout.vllm.ready_timeout


def test_a_trl_server_config_runs_grpos_server_mode(tmp_path: Path) -> None:
    """TRL's vllm_mode: server reaches grpo's server mode at the file's URL and timeout, passing
    grpo's own check of the server keys, and tells the user which server to start: TRL's
    `trl vllm-serve` is another server (no worker extension grpo pushes weights through)."""
    fields = {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": "http://10.0.0.5:8000/",
        "vllm_server_host": "10.9.9.9",  # TRL ignores host and port when base_url is set
        "vllm_server_port": 9000,
        "vllm_server_timeout": 600,
        "vllm_group_port": 51217,
    }
    overrides, printed = _expand(_write(tmp_path, fields))
    cfg = _composed(overrides)
    assert _server_keys(cfg) == ("vllm", "server", "http://10.0.0.5:8000", 600.0)
    validate_generation(cfg.model, cfg.data, cfg.rollout)  # what grpo train checks before loading the model
    lines = printed.splitlines()
    [mode_line] = [line for line in lines if line.startswith("  vllm_mode: ")]
    assert "python -m grpo_cli.rollout.vllm_server serve" in mode_line and "trl vllm-serve" in mode_line
    for name in ("vllm_server_host", "vllm_server_port"):
        [line] = [line for line in lines if line.startswith(f"  {name}: ")]
        assert "vllm_server_base_url" in line, printed
    [group] = [line for line in lines if line.startswith("  vllm_group_port: no equivalent in grpo: ")]
    assert "NCCL" in group


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ({"vllm_server_host": "10.1.2.3", "vllm_server_port": 8001}, "http://10.1.2.3:8001"),
        ({"vllm_server_port": 8001}, "http://127.0.0.1:8001"),  # TRL's default host 0.0.0.0: this machine
        ({}, "http://127.0.0.1:8000"),  # TRL's defaults reach a server on this machine's port 8000
        ({"vllm_server_host": "fe80::1"}, "http://[fe80::1]:8000"),
        ({"vllm_server_base_url": "sampler:8000"}, "http://sampler:8000"),  # no scheme: http, as TRL's client
    ],
    ids=["host and port", "default host", "defaults", "IPv6", "no scheme"],
)
def test_trls_server_address_becomes_the_server_url(tmp_path: Path, address: dict, url: str) -> None:
    fields = {"use_vllm": True, "vllm_mode": "server", **address}
    cfg = _composed(_expand(_write(tmp_path, fields))[0])
    assert _server_keys(cfg)[:3] == ("vllm", "server", url)
    validate_generation(cfg.model, cfg.data, cfg.rollout)


def test_a_colocate_file_still_runs_colocated(tmp_path: Path) -> None:
    """vllm_mode: colocate is grpo's colocated engine; the server fields TRL reads only in server mode
    set nothing and say so."""
    fields = {"use_vllm": True, "vllm_mode": "colocate", "vllm_server_port": 9000, "vllm_server_timeout": 60}
    overrides, printed = _expand(_write(tmp_path, fields))
    assert overrides == ["rollout.backend=vllm", "rollout.vllm.mode=colocated"]
    assert _server_keys(_composed(overrides)) == ("vllm", "colocated", "", 300.0)
    for name in ("vllm_server_port", "vllm_server_timeout"):
        [line] = [line for line in printed.splitlines() if line.startswith(f"  {name}: ")]
        assert "vllm_mode is colocate" in line, printed


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, {"learning_rate": "1e-6", "max_steps": 50, "per_device_train_batch_size": 16})
    overrides, printed = _expand(path, "optim.lr=0.01", "algo=dapo")
    assert [arg for arg in overrides if arg.startswith("optim.lr=")] == ["optim.lr=0.01"]
    assert "train.steps=50" in overrides and "train.prompts_per_step=2" in overrides
    cfg = _composed(overrides)
    assert (cfg.optim.lr, cfg.train.steps, cfg.algo.loss_type) == (0.01, 50, "dapo")
    assert printed.splitlines()[1].endswith("optim.lr=0.01 algo=dapo")


def test_the_batch_counts_prompts_and_optimizer_steps_as_trl_does(tmp_path: Path) -> None:
    """64 completions sampled per generation, 16 per micro-batch, 2 micro-batches per optimizer step:
    8 prompts, 2 optimizer steps per pass, 2 passes; TRL's 100 optimizer steps are 25 grpo steps."""
    fields = {
        "generation_batch_size": 64,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 2,
        "num_generations": 8,
        "num_iterations": 2,
        "max_steps": 100,
    }
    cfg = _composed(_expand(_write(tmp_path, fields))[0])
    assert (cfg.train.prompts_per_step, cfg.algo.mini_batches, cfg.train.grad_accum_steps) == (8, 2, 2)
    assert (cfg.algo.num_iterations, cfg.train.steps) == (2, 25)


def test_the_intervals_keep_trls_count_of_checkpoints_evaluations_and_logs(tmp_path: Path) -> None:
    """TRL's save, eval and logging steps count optimizer steps, as max_steps does: with 4 optimizer
    steps per grpo step, TRL's 5 checkpoints, 8 evaluations and 25 logged steps in 100 optimizer
    steps stay 5, 8 and 25 in grpo's 25 steps (not 1 checkpoint plus the final one)."""
    fields = {
        "per_device_train_batch_size": 8,
        "steps_per_generation": 4,  # 4 mini-batches: 4 optimizer steps per grpo step
        "num_generations": 8,
        "max_steps": 100,
        "save_steps": 20,
        "eval_strategy": "steps",
        "eval_steps": 12,
        "logging_steps": 4,
        "log_completions": True,
        "torch_empty_cache_steps": 8,
    }
    cfg = _composed(_expand(_write(tmp_path, fields))[0])
    assert (cfg.algo.mini_batches, cfg.train.steps) == (4, 25)
    trl_counts = [100 // 20, 100 // 12, 100 // 4, 100 // 4, 100 // 8]
    grpo_every = [
        cfg.train.save_every,
        cfg.train.eval_every,
        cfg.monitor.print_every,
        cfg.monitor.log_completions_every,
        cfg.train.empty_cache_every,
    ]
    assert [cfg.train.steps // every for every in grpo_every] == trl_counts
    # An interval that is no whole number of grpo steps rounds down, never fewer events than TRL's:
    # 30 optimizer steps of 4 is every 7 grpo steps (3 checkpoints in 25, TRL's 3 in 100).
    cfg = _composed(_expand(_write(tmp_path, {**fields, "save_steps": 30, "save_strategy": "steps"}))[0])
    assert cfg.train.save_every == 7 and cfg.train.steps // cfg.train.save_every >= 100 // 30
    # A share of max_steps is a share of train.steps (0.2: every 5th of 25).
    cfg = _composed(_expand(_write(tmp_path, {**fields, "save_steps": 0.2}))[0])
    assert cfg.train.save_every == 5


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"learning_rat": 1e-6}, ["learning_rat is not a field of TRL's GRPOConfig; did you mean learning_rate?"]),
        ({"learning_rate": "fast"}, ["learning_rate='fast': expected a number"]),
        ({"temperature": [1, 2]}, ["temperature: rollout.temperature=[1,2]"]),
        ({"loss_type": "ppo"}, ["loss_type", "algo.loss_type", "must be one of"]),
        ({"lr_scheduler_type": "polynomial"}, ["lr_scheduler_type='polynomial'", "constant"]),
        ({"bf16": True, "fp16": True}, ["fp16=True sets precision='fp16', but bf16 set it to 'bf16'"]),
        ({"per_device_train_batch_size": 6}, ["per_device_train_batch_size=6", "whole groups of num_generations=8"]),
        ({"report_to": "all"}, ["report_to='all'", "tensorboard"]),
        ({"vllm_mode": "remote"}, ["vllm_mode='remote'", "colocate, server"]),
        ({"vllm_mode": "server", "vllm_server_port": "http"}, ["vllm_server_port='http'", "a number"]),
    ],
    ids=[
        "unknown field",
        "not a number",
        "wrong type",
        "no such loss",
        "schedule",
        "two precisions",
        "groups",
        "trackers",
        "vllm mode",
        "server port",
    ],
)
def test_a_bad_file_stops_naming_the_file_and_the_field(tmp_path: Path, fields: dict, words: list[str]) -> None:
    path = _write(tmp_path, fields)
    with pytest.raises(GrpoError) as err:
        _expand(path)
    assert str(err.value).startswith(f"{path}: ")
    for word in words:
        assert word in str(err.value)


def test_a_file_that_is_no_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "grpo_config.yaml"
    path.write_text("- learning_rate\n")
    with pytest.raises(GrpoError, match="expected a mapping of GRPOConfig fields"):
        _expand(path)
    with pytest.raises(GrpoError, match="no such file"):
        _expand(tmp_path / "missing.yaml")


def test_grpo_train_runs_a_trl_config_file(tmp_path: Path) -> None:
    """The CLI as a user runs it: the command line printed, then one step with the file's settings."""
    path = _write(
        tmp_path,
        {
            "num_generations": 4,
            "per_device_train_batch_size": 8,  # 2 prompts of 4 completions
            "max_completion_length": 4,
            "loss_type": "dapo",
            "learning_rate": 3e-3,
            "beta": 0.04,
            "use_cpu": True,
            "bf16": False,
            "push_to_hub": False,
        },
    )
    run_dir = tmp_path / "run"
    quick = ("train.steps=1", "monitor.console=plain", "monitor.plots=false")
    proc = run_grpo("train", f"trl_config={path}", *quick, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  grpo train rollout.num_generations=4 train.prompts_per_step=2" in proc.stderr
    assert "algo.loss_type=dapo" in proc.stderr and "  push_to_hub: no equivalent in grpo: " in proc.stderr
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["algo"]["loss_type"] == "dapo" and saved["algo"]["beta"] == 0.04
    assert (saved["rollout"]["num_generations"], saved["train"]["prompts_per_step"]) == (4, 2)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1


def test_every_key_the_mapping_names_is_a_key_of_grpo_train() -> None:
    """A renamed or removed schema key fails here rather than in a user's trl_config run."""
    groups = {"precision"}  # config groups: precision=bf16
    for field in FIELDS.values():
        for key in field.keys:
            if key in groups or key.startswith("hydra."):
                continue
            check_key(key.replace(".N.", ".0."), TrainConfig)


def test_the_real_model_example_converts_as_its_page_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/trl_smollm2_config.yaml, a config in the shape of TRL's own examples: the printed
    command line and refusals the page quotes are what the conversion prints today, and the line
    composes into the run the page describes."""
    monkeypatch.chdir(REPO)  # the page's command runs from the repository's root
    argv = SMOLLM2_ARGS  # the options the page shows after the file's name, defined once
    overrides, printed = _expand(Path(SMOLLM2_EXAMPLE), *argv)
    page = (REPO / "docs" / "coming-from-trl.md").read_text()
    for line in printed.splitlines():
        assert line in page, f"docs/coming-from-trl.md quotes another conversion; now it prints:\n{line}"
    cfg = _composed(overrides)
    assert (cfg.train.prompts_per_step, cfg.train.grad_accum_steps, cfg.rollout.num_generations) == (4, 4, 8)
    assert (cfg.optim.warmup_steps, cfg.algo.loss_type, cfg.precision.dtype, cfg.rollout.backend) == (
        20,
        "dapo",
        "bf16",
        "hf",
    )
    assert cfg.monitor.trackers == ["tensorboard"] and cfg.model.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
