"""`ConstantLR`: a fixed rate."""

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import ConstantScheduler, TagsT, alias


class ConstantLR(LRScheduler, ConstantScheduler):
    """``learning_rate`` at every step (``total_iters`` only bounds it within a SequentialLR)."""

    val = alias("learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float,
                 total_iters: int | None = None, param_group_tags: TagsT = None):
        ConstantScheduler.__init__(self, optimizer, learning_rate, total_iters,
                                   param_group_tags=param_group_tags)
