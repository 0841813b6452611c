"""Check command-line override keys against the schema before Hydra composes anything.

Hydra's `+key=value` adds a key even to a structured config; this is where that is refused,
with the nearest valid key suggested for typos.
"""

from __future__ import annotations

import argparse
import copy
import re
from importlib import resources
from pathlib import Path

import yaml
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_cli.commands.plugins import check_hydra_override, require_plugin
from grpo_cli.config.checks import check_choice
from grpo_cli.config.keys import check_key
from grpo_cli.errors import GrpoError

_ABSENT = object()  # OmegaConf.select's default: the schema has no node at that key


def _conf_roots(extra_dirs: list[str]) -> list[Path]:
    """Where config files are found: the packaged conf/ and any --config-dir."""
    return [Path(str(resources.files("grpo_cli.conf")))] + [Path(d) for d in extra_dirs]


def _config_groups(extra_dirs: list[str]) -> set[str]:
    """Group names: the packaged conf/ subdirectories plus those of any --config-dir."""
    groups = set()
    for root in _conf_roots(extra_dirs):
        if root.is_dir():
            groups.update(
                p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"
            )
    return groups


def check_group_choice(group: str, option: str, extra_dirs: list[str]) -> None:
    """`reward=nonexistent` in one line with the nearest option and the list, as a typo in a key
    gets: Hydra would print a 14-line block with its search path."""
    options = set()
    for root in _conf_roots(extra_dirs):
        folder = root / group
        if folder.is_dir():
            options.update(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))
    if options:  # a group no conf/ holds a file of (a Hydra one, a plugin's) is Hydra's to check
        check_choice(group, option, tuple(sorted(options)))


def check_modes(args: argparse.Namespace) -> None:
    """Hydra takes one mode at a time and says so in a traceback (`-m ... --cfg job`): one line instead."""
    if args.multirun and args.cfg:
        raise GrpoError(
            f"-m with --cfg {args.cfg}: --cfg prints one composed config, and -m composes one per job: drop -m "
            "and give each swept key one value to see that job's config, or drop --cfg to run the sweep"
        )
    given = [
        flag
        for flag, on in (
            ("--run", args.run),
            ("-m", args.multirun),
            ("--cfg", args.cfg is not None),
            ("--info", args.info is not None),
            ("--shell-completion", args.shell_completion),
        )
        if on
    ]
    if len(given) > 1:
        raise GrpoError(f"{' with '.join(given)}: give one of --run, -m, --cfg, --info and --shell-completion")


def _check_node(node: object, prefix: str, schema: type) -> None:
    """Every key of a YAML mapping, into nested mappings and lists of mappings (reward.functions)."""
    if isinstance(node, dict):
        for name, value in node.items():
            key = f"{prefix}{name}"
            check_key(key, schema)
            _check_node(value, key + ".", schema)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if isinstance(item, (dict, list)):
                _check_node(item, f"{prefix}{i}.", schema)


def _load_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise GrpoError(f"{path}: invalid YAML: {err}") from None


def _check_file(path: Path, prefix: str, schema: type) -> object:
    """The keys of one config file whose body lands under `prefix`, errors naming the file;
    returns the loaded file."""
    node = _load_yaml(path)
    if not isinstance(node, dict):
        return node
    body = {k: v for k, v in node.items() if k not in ("defaults", "hydra")}
    try:
        _check_node(body, prefix, schema)
    except GrpoError as err:
        raise GrpoError(f"{path}: {err}") from None
    return node


def check_primary_config(config_dir: str, config_name: str, schema: type) -> None:
    """A user's own primary config (a recipe): its keys get the same did-you-mean as overrides.

    Hydra would reject a typo too, but without suggesting the key that was meant.
    """
    path = Path(config_dir) / (config_name if config_name.endswith(".yaml") else f"{config_name}.yaml")
    if not path.is_file():
        return  # Hydra reports a missing config with the search path
    node = _check_file(path, "", schema)
    defaults = node.get("defaults", []) if isinstance(node, dict) else []
    for entry in defaults if isinstance(defaults, list) else []:
        # `- override reward: mine` / `- reward: mine`: the user's own option files, checked too
        if isinstance(entry, dict) and len(entry) == 1:
            ((group, option),) = entry.items()
            group = str(group).removeprefix("override ").lstrip("/")
            if not isinstance(option, str) or not re.fullmatch(r"[\w/]+", group):
                continue
            if group.startswith("hydra/"):  # `- override hydra/launcher: slurm`: the plugin must be installed
                require_plugin(group, option, [config_dir])
            elif not group.startswith("hydra"):
                try:
                    check_group_choice(group, option, [config_dir])
                except GrpoError as err:
                    raise GrpoError(f"{path}: {err}") from None
                check_group_option(config_dir, group, option, schema)


def check_group_option(config_dir: str, group: str, option: str, schema: type) -> None:
    """A group option from a user's --config-dir (reward=mine: DIR/reward/mine.yaml), keys under
    `group.`. Hydra rejects its typos as well, but names the key without its path or a suggestion.
    A file with its own `# @package` line lands elsewhere and is left to Hydra."""
    path = Path(config_dir) / group / f"{option}.yaml"
    if not path.is_file() or "# @package" in path.read_text():
        return
    _check_file(path, group.replace("/", ".") + ".", schema)


def check_value(override: Override, schema_config: DictConfig) -> None:
    """The value of `key=value` against the schema's type, in one line: Hydra would print a 6-line
    block for `optim.lr=abc`. Each value of a choice sweep (`-m optim.lr=1e-3,abc`) is checked too;
    a key the schema has no node for (an entry of a list the YAML fills) is left to Hydra."""
    key = override.key_or_group
    if override.is_delete() or OmegaConf.select(schema_config, key, default=_ABSENT) is _ABSENT:
        return
    if override.is_sweep_override():
        values = list(override.sweep_iterator()) if override.is_choice_sweep() else []
    else:
        values = [override.value()]
    for value in values:
        try:
            OmegaConf.update(copy.deepcopy(schema_config), key, value, merge=True)
        except OmegaConfBaseException as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            shown = value if override.is_sweep_override() else override.get_value_element_as_str()
            raise GrpoError(f"{key}={shown}: {reason}") from None


def check_no_repeats(overrides: list[Override]) -> None:
    """A sweep's key given twice (`-m train.seed=0,1 train.seed=2`): Hydra keeps one and runs fewer
    jobs than written, without a word. A single run keeps the last, as Hydra documents (a script's
    base overrides, then the one it changes), so only -m refuses."""
    seen: dict[str, str] = {}  # key (`+key`, `++key`, `~key` are the same key) -> as written
    for override in overrides:
        name = override.key_or_group
        if name in seen:
            raise GrpoError(
                f"-m: {name} is given twice ({seen[name]} and {override.input_line}): a sweep takes one value "
                f"list per key: give {name} once, with every value (e.g. {name}=a,b,c)"
            )
        seen[name] = override.input_line or override.get_key_element()


def check_overrides(argv: list[str], schema: type) -> None:
    args, _ = get_args_parser().parse_known_args(argv)
    check_modes(args)
    if args.config_dir and args.config_name:
        check_primary_config(args.config_dir, args.config_name, schema)
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException as err:
        raise GrpoError(str(err)) from None
    if args.multirun:
        check_no_repeats(overrides)
    groups = _config_groups([args.config_dir] if args.config_dir else [])
    schema_config = OmegaConf.structured(schema)
    for override in overrides:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            # Hydra's own keys (hydra.sweeper.n_trials=...) are Hydra's to check; its plugins are an extra
            check_hydra_override(override, [args.config_dir] if args.config_dir else [])
            continue
        if key in groups and not override.is_delete():
            # a group choice such as model=hf, or a sweep over several (reward=a,b)
            options = override.sweep_string_iterator() if override.is_choice_sweep() else [override.value()]
            for option in options:
                if option is None:  # Hydra's own answer is a ValueError traceback
                    raise GrpoError(f"{key}=null: a group choice cannot be null; ~{key} drops the group")
                if isinstance(option, str):  # a glob sweep is Hydra's to expand
                    check_group_choice(key, option, [args.config_dir] if args.config_dir else [])
                    if args.config_dir:
                        check_group_option(args.config_dir, key, option, schema)
            continue
        check_key(key, schema)
        check_value(override, schema_config)
