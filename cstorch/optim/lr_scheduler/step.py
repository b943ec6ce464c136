"""`StepLR`: decay by ``gamma`` every ``step_size`` steps."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import StepScheduler, TagsT, alias


class StepLR(LRScheduler, StepScheduler):
    """``initial * gamma ** floor(t / step_size)``."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 step_size: int, gamma: float, param_group_tags: TagsT = None):
        StepScheduler.__init__(self, optimizer, initial_learning_rate, step_size, gamma,
                               param_group_tags=param_group_tags)
