"""Check command-line override keys against the schema before Hydra composes anything.

Hydra's `+key=value` adds a key even to a structured config; this is where that is refused,
with the nearest valid key suggested for typos.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from grpo_cli.config.validate import check_key
from grpo_cli.errors import GrpoError


def _config_groups(extra_dirs: list[str]) -> set[str]:
    """Group names: the packaged conf/ subdirectories plus those of any --config-dir."""
    roots = [Path(str(resources.files("grpo_cli.conf")))] + [Path(d) for d in extra_dirs]
    groups = set()
    for root in roots:
        if root.is_dir():
            groups.update(
                p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"
            )
    return groups


def _check_mapping(node: dict, prefix: str, schema: type) -> None:
    for name, value in node.items():
        key = f"{prefix}{name}"
        check_key(key, schema)
        if isinstance(value, dict):
            _check_mapping(value, key + ".", schema)


def check_primary_config(config_dir: str, config_name: str, schema: type) -> None:
    """A user's own primary config (a recipe): its keys get the same did-you-mean as overrides.

    Hydra would reject a typo too, but without suggesting the key that was meant.
    """
    path = Path(config_dir) / (config_name if config_name.endswith(".yaml") else f"{config_name}.yaml")
    if not path.is_file():
        return  # Hydra reports a missing config with the search path
    try:
        node = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise GrpoError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(node, dict):
        return
    body = {k: v for k, v in node.items() if k not in ("defaults", "hydra")}
    try:
        _check_mapping(body, "", schema)
    except GrpoError as err:
        raise GrpoError(f"{path}: {err}") from None


def check_overrides(argv: list[str], schema: type) -> None:
    args, _ = get_args_parser().parse_known_args(argv)
    if args.config_dir and args.config_name:
        check_primary_config(args.config_dir, args.config_name, schema)
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException as err:
        raise GrpoError(str(err)) from None
    groups = _config_groups([args.config_dir] if args.config_dir else [])
    for override in overrides:
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/"):
            continue
        if key in groups and not override.is_delete():
            continue  # a group choice such as model=hf
        check_key(key, schema)
