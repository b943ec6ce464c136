"""`PiecewiseConstantLR`: a rate per interval between milestones."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import PiecewiseConstantScheduler


class PiecewiseConstantLR(LRScheduler, PiecewiseConstantScheduler):
    """``learning_rates[i]`` where i is the number of ``milestones`` reached (``t >= m``);
    there is one more rate than milestones."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates, milestones,
                 param_group_tags=None):
        PiecewiseConstantScheduler.__init__(self, optimizer, learning_rates, milestones,
                                            param_group_tags=param_group_tags)

    @property
    def learning_rates(self):
        return self.values

    def lr_at(self, step):
        return PiecewiseConstantScheduler.value_at(self, step)
