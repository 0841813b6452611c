"""The GRPO core: advantages, losses, the optimizer schedule and the training loop.

Nothing here imports Hydra or the CLI; it takes the schema dataclasses or plain arguments.
"""

from grpo_cli.core.advantages import AdvantageStats, group_advantages
from grpo_cli.core.loss import aggregate_loss, clipped_surrogate, importance_ratio, kl_penalty

__all__ = [
    "AdvantageStats",
    "aggregate_loss",
    "clipped_surrogate",
    "group_advantages",
    "importance_ratio",
    "kl_penalty",
]
