"""Overrides of Hydra's own config that grpo checks before Hydra composes anything.

Hydra's sweeper and launcher plugins are an optional extra (`grpo-cli[sweep]`): without it,
`hydra/sweeper=optuna` fails inside Hydra with "Could not find 'hydra/sweeper/optuna'" and a list of
the options that are installed, which does not say what to install. And a search space written as
`hydra.sweeper.params.optim.lr=...` nests `lr` under `optim`, where no sweeper looks; Hydra's own
error for it does not say what to write instead.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from hydra.core.override_parser.types import Override

from grpo_cli.errors import GrpoError, MissingExtra

EXTRA = 'pip install "grpo-cli[sweep]"'
SWEEP_PARAMS = "hydra.sweeper.params."


@dataclass(frozen=True)
class Plugin:
    package: str  # the hydra_plugins package that registers the config group options
    library: str  # what it drives; only looked up here (importing optuna costs a second)
    title: str  # how the error names it


OPTUNA = Plugin("hydra_plugins.hydra_optuna_sweeper", "optuna", "Hydra's optuna sweeper")
JOBLIB = Plugin("hydra_plugins.hydra_joblib_launcher", "joblib", "Hydra's joblib launcher")
SUBMITIT = Plugin("hydra_plugins.hydra_submitit_launcher", "submitit", "Hydra's submitit launcher")

# (group, option) as the plugins register them; presets of ours reach them through their defaults
PLUGIN_OPTIONS = {
    ("hydra/sweeper", "optuna"): OPTUNA,
    ("hydra/launcher", "joblib"): JOBLIB,
    ("hydra/launcher", "submitit_slurm"): SUBMITIT,
    ("hydra/launcher", "submitit_local"): SUBMITIT,
}


def is_installed(plugin: Plugin) -> bool:
    """The plugin package imports (its __init__ is empty) and its library can be found."""
    try:
        importlib.import_module(plugin.package)
    except ImportError:
        return False
    return importlib.util.find_spec(plugin.library) is not None


def _preset_base(group: str, option: str, config_dirs: list[str]) -> str:
    """The plugin option a preset builds on: conf/hydra/launcher/slurm.yaml lists `submitit_slurm` in
    its defaults. A user's --config-dir may hold presets too; an option with no file is itself."""
    roots = [Path(str(resources.files("grpo_cli.conf")))] + [Path(d) for d in config_dirs]
    seen = {option}
    while (group, option) not in PLUGIN_OPTIONS:
        path = next(
            (root / group / f"{option}.yaml" for root in roots if (root / group / f"{option}.yaml").is_file()), None
        )
        if path is None:
            return option
        try:
            node = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            return option  # Hydra reports the file
        defaults = node.get("defaults", []) if isinstance(node, dict) else []
        bases = [d for d in defaults if isinstance(d, str) and d != "_self_"] if isinstance(defaults, list) else []
        if not bases or bases[0] in seen:
            return option
        option = bases[0]
        seen.add(option)
    return option


def require_plugin(group: str, option: str, config_dirs: list[str]) -> None:
    """Raise MissingExtra when `group=option` needs a Hydra plugin that is not installed."""
    plugin = PLUGIN_OPTIONS.get((group, _preset_base(group, option, config_dirs)))
    if plugin is not None and not is_installed(plugin):
        raise MissingExtra(f"{group}={option} needs {plugin.title}: {EXTRA}")


def check_hydra_override(override: Override, config_dirs: list[str]) -> None:
    """A `hydra/GROUP=option` override needs its plugin installed (a choice sweep: each option);
    `hydra.sweeper.params.optim.lr=...` is refused with the form that works."""
    key = override.key_or_group
    if key.startswith("hydra/") and not override.is_delete():
        options = override.sweep_string_iterator() if override.is_choice_sweep() else [override.value()]
        for option in options:
            if isinstance(option, str):
                require_plugin(key, option, config_dirs)
    param = key.removeprefix(SWEEP_PARAMS)
    if key.startswith(SWEEP_PARAMS) and "." in param:  # it would nest params.optim.lr, which no sweeper reads
        raise GrpoError(
            f"{key}: on the command line this nests the key under hydra.sweeper.params, where no sweeper "
            f"finds it; give the search space as the override itself, e.g. '{param}=tag(log, interval(1e-4, "
            "1e-2))', or in a sweeper preset's params: (conf/hydra/sweeper/optuna_lr_beta.yaml)"
        )
