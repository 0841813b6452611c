"""Config schema (plain dataclasses) and its validation; Hydra registration lives in `commands.entry`.

The package imports only the schema, so that `config.dotted` (used by the rollout stream and
training resume) comes without the checks. The rest lives in its own module: `keys` (unknown keys),
`checks` and the `*_checks` modules (each command's values), `smoke` (the smoke-mode shrink).
"""

from grpo_cli.config.schema import TrainConfig

__all__ = ["TrainConfig"]
