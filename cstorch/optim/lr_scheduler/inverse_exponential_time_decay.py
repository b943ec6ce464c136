"""`InverseExponentialTimeDecayLR`: inverse time decay with an exponent on the step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import InverseExponentialTimeDecayScheduler, TagsT, alias


class InverseExponentialTimeDecayLR(LRScheduler, InverseExponentialTimeDecayScheduler):
    """``initial / (1 + decay_rate * t ** step_exponent / total_iters)``; with ``staircase``
    the ratio ``t ** step_exponent / total_iters`` is floored."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 step_exponent: int, total_iters: int, decay_rate: float,
                 staircase: bool = False, param_group_tags: TagsT = None):
        InverseExponentialTimeDecayScheduler.__init__(
            self, optimizer, initial_learning_rate, step_exponent, total_iters, decay_rate,
            staircase, param_group_tags=param_group_tags)
