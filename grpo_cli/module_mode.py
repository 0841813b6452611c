"""A module in eval mode for a block, switched by torch's own `Module.train`.

transformers 5.x requires the `kernels` package, and its `PreTrainedModel.train` re-kernelizes the
model on every change of mode: 4.6 ms an eval-and-back on SmolLM2-135M (1.5 ms through torch's), and
about 1 ms of the tiny default's 28 ms step. A sampling pass switches the policy to eval and back
every step; the kernels chosen for training serve its no-grad forwards as well, so the switch
inside a step goes through torch's method and leaves the kernel mode as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    was_training = module.training
    torch.nn.Module.train(module, False)
    try:
        yield module
    finally:
        torch.nn.Module.train(module, was_training)
