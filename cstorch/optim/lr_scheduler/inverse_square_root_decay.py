"""`InverseSquareRootDecayLR`: the Transformer's inverse square root decay."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import InverseSquareRootDecayScheduler, TagsT, alias


class InverseSquareRootDecayLR(LRScheduler, InverseSquareRootDecayScheduler):
    """``initial * scale / sqrt(max(t, warmup_steps))``: constant for ``warmup_steps``
    steps, then decaying as ``1 / sqrt(t)``."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float = 1.0,
                 scale: float = 1.0, warmup_steps: int = 1.0, param_group_tags: TagsT = None):
        InverseSquareRootDecayScheduler.__init__(self, optimizer, initial_learning_rate, scale,
                                                 warmup_steps, param_group_tags=param_group_tags)
