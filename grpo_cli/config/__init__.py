"""Config schema (plain dataclasses) and its validation; Hydra registration lives in `commands.entry`."""

from grpo_cli.config.schema import TrainConfig
from grpo_cli.config.validate import apply_smoke, validate

__all__ = ["TrainConfig", "apply_smoke", "validate"]
