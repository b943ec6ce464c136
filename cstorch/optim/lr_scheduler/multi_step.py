"""`MultiStepLR`: decay by ``gamma`` at each milestone."""

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import MultiStepScheduler, TagsT, alias


class MultiStepLR(LRScheduler, MultiStepScheduler):
    """``initial * gamma ** (number of milestones <= t)``."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 gamma: float, milestones: list[int], param_group_tags: TagsT = None):
        MultiStepScheduler.__init__(self, optimizer, initial_learning_rate, gamma, milestones,
                                    param_group_tags=param_group_tags)
