"""Pipelines over RewardBatch that compose rewards with the core: `grpo score` (and `grpo eval
input=FILE`) on a rollouts file.

Rewards never import the core; the group advantages a scored file carries are added here.
"""

from grpo_cli.scoring.score_file import score_rollouts_file, scored_batches

__all__ = ["score_rollouts_file", "scored_batches"]
