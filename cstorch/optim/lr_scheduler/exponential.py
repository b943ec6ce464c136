"""`ExponentialLR`: exponential decay."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import ExponentialScheduler, TagsT, alias


class ExponentialLR(LRScheduler, ExponentialScheduler):
    """``initial * decay_rate ** (t / total_iters)``; with ``staircase`` the exponent is
    floored, so the rate drops once every ``total_iters`` steps."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: TagsT = None):
        ExponentialScheduler.__init__(self, optimizer, initial_learning_rate, total_iters,
                                      decay_rate, staircase, param_group_tags=param_group_tags)
