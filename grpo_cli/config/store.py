"""Register each subcommand's schema with Hydra's ConfigStore: the base its primary config composes onto."""

from hydra.core.config_store import ConfigStore


def register_schemas() -> None:
    from grpo_cli.commands import SUBCOMMANDS  # the table names every schema once

    for sub in SUBCOMMANDS:
        ConfigStore.instance().store(name=sub.schema_name, node=sub.schema)
