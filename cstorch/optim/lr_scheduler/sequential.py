"""`SequentialLR`: learning-rate schedules one after another, each from its own step 0."""
from typing import List

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import SequentialScheduler


class SequentialLR(LRScheduler, SequentialScheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its step 0,
    and so on. The sub-schedulers only supply their formulas; this scheduler's own counter
    drives them. Without ``milestones`` they are the running sums of the sub-schedulers'
    ``total_iters``."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: List[LRScheduler],
                 milestones=None, last_epoch=-1, param_group_tags=None):
        SequentialScheduler.__init__(self, optimizer, schedulers, milestones, last_epoch,
                                     param_group_tags=param_group_tags)
