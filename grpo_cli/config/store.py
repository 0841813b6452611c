"""Register the schema with Hydra's ConfigStore: the base every primary config composes onto."""

from hydra.core.config_store import ConfigStore

from grpo_cli.config.schema import ScoreConfig, TrainConfig


def register_schemas() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    ConfigStore.instance().store(name="score_schema", node=ScoreConfig)
