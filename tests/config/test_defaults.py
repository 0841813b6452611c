"""The schema's defaults are the default run: `TrainConfig()` is what `grpo train` composes with no
overrides, `ScoreConfig()` what `grpo score` composes, value for value.

So a library user who builds `TrainConfig()` in code trains exactly what the CLI would, and the
YAML under conf/ (which users read) cannot drift from the dataclasses unnoticed.
"""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from grpo_cli.config.dotted import flatten
from grpo_cli.config.schema import (
    CheckConfig,
    EvalConfig,
    ExportConfig,
    RolloutRunConfig,
    ScoreConfig,
    TrainConfig,
)
from grpo_cli.config.train_checks import validate
from tests.conftest import run_grpo


def _composed(subcommand: str) -> dict:
    """`grpo SUBCOMMAND --cfg job`, run as a user runs it, parsed back."""
    result = run_grpo(subcommand, "--cfg", "job", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return OmegaConf.to_container(OmegaConf.create(result.stdout))


@pytest.mark.parametrize(
    ("subcommand", "schema"),
    [
        ("train", TrainConfig),
        ("score", ScoreConfig),
        ("rollout", RolloutRunConfig),
        ("eval", EvalConfig),
        ("export", ExportConfig),
        ("check", CheckConfig),
    ],
)
def test_schema_defaults_equal_the_composed_default_run(subcommand: str, schema: type) -> None:
    composed = flatten(_composed(subcommand))
    # Through OmegaConf like the composed side, so both hold the same plain types.
    defaults = flatten(OmegaConf.to_container(OmegaConf.create(dataclasses.asdict(schema()))))
    differing = {
        key: (composed.get(key, "<absent>"), defaults.get(key, "<absent>"))
        for key in sorted(composed.keys() | defaults.keys())
        if composed.get(key, "<absent>") != defaults.get(key, "<absent>")
    }
    assert not differing, f"grpo {subcommand} --cfg job vs {schema.__name__}() (composed, schema): {differing}"


def test_the_default_train_config_validates_without_warnings() -> None:
    assert validate(TrainConfig()) == []
