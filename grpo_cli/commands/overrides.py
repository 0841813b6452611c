"""Check command-line override keys against the schema before Hydra composes anything.

Hydra's `+key=value` adds a key even to a structured config; this is where that is refused,
with the nearest valid key suggested for typos.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

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
                p.relative_to(root).as_posix()
                for p in root.rglob("*")
                if p.is_dir() and p.name != "__pycache__"
            )
    return groups


def check_overrides(argv: list[str], schema: type) -> None:
    args, _ = get_args_parser().parse_known_args(argv)
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
