"""`SequentialLR`: learning-rate schedules one after another, each from its own step 0."""

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import SequentialScheduler, TagsT


class SequentialLR(LRScheduler, SequentialScheduler):
    """``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its step 0, and
    so on. The inner schedules only supply their formulas; this one's counter drives them."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[LRScheduler],
                 milestones: list[int], last_epoch: int = -1, param_group_tags: TagsT = None):
        SequentialScheduler.__init__(self, optimizer, schedulers, milestones, last_epoch,
                                     param_group_tags=param_group_tags)
