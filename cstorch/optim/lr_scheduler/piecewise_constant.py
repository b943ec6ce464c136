"""`PiecewiseConstantLR`: a rate per interval between milestones."""

import torch

from cstorch.optim.lr_scheduler.constant import ConstantLR
from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import PiecewiseConstantScheduler, TagsT


class PiecewiseConstantLR(LRScheduler, PiecewiseConstantScheduler):
    """``learning_rates[i]`` where i is the number of ``milestones`` reached (``t >= m``);
    there is one more rate than milestones."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: list[float],
                 milestones: list[int], param_group_tags: TagsT = None):
        PiecewiseConstantScheduler.__init__(self, optimizer, ConstantLR, learning_rates,
                                            milestones, param_group_tags=param_group_tags)
