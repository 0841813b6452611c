"""The import rules that keep the core reusable (docs/architecture.md §1), checked on
the source: the maths leaves import nothing of the trainer, rewards import no core, and nothing
below the CLI imports Hydra."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_cli"


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(*subpackages: str) -> list[Path]:
    return sorted(p for sub in subpackages for p in (PACKAGE / sub).rglob("*.py"))


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        bad = sorted(name for name in imports_of(path) if name.split(".")[0] in forbidden or name.startswith(forbidden))
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    return found


@pytest.mark.parametrize(
    ("subpackages", "forbidden"),
    [
        # the maths declares what it needs of a rollout (core.logprobs.RolloutRows) instead of importing one
        (
            ("core",),
            (
                "grpo_cli.rollout",
                "grpo_cli.training",
                "grpo_cli.commands",
                "grpo_cli.scoring",
                "grpo_cli.monitor",
                "hydra",
            ),
        ),
        (("rewards",), ("grpo_cli.core", "grpo_cli.training", "grpo_cli.commands", "grpo_cli.scoring", "hydra")),
        (("rollout", "data", "monitor", "config"), ("grpo_cli.training", "grpo_cli.commands", "hydra")),
        (("training", "scoring"), ("grpo_cli.commands", "hydra", "omegaconf")),
        # metrics are plain Python on lists: the trainer and `grpo eval` both import them
        (("evaluation",), ("grpo_cli.training", "grpo_cli.commands", "grpo_cli.scoring", "hydra", "torch")),
    ],
)
def test_layers_import_only_downwards(subpackages: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    assert offending(modules(*subpackages), forbidden) == {}


def test_models_load_without_the_core() -> None:
    """models.py is below core: what both need of a checkpoint lives in grpo_cli.checkpoint."""
    assert offending([PACKAGE / "models.py"], ("grpo_cli.core", "grpo_cli.training", "grpo_cli.rollout")) == {}


def test_stats_is_a_leaf() -> None:
    assert {name for name in imports_of(PACKAGE / "stats.py") if name.startswith("grpo_cli")} == set()


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject lists packages by hand (conf/ maps to grpo_cli.conf): a new subpackage must be listed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")} | {
        "grpo_cli.conf"
    }
    assert present - listed == set()
