"""The composition root of `grpo train`: the trainer, its state registry and the step pipeline.

Library use: `trainer = GRPOTrainer(TrainConfig(), run_dir, observers=[...]); trainer.setup();
trainer.train()`; `TrainConfig()` is the default run of `grpo train`.
"""

from grpo_cli.training.state import TrainState
from grpo_cli.training.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "TrainState"]
