"""`PiecewiseConstantLR`: a rate per interval between milestones."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class PiecewiseConstantLR(LRScheduler):
    """``learning_rates[i]`` where i is the number of ``milestones`` reached (``t >= m``);
    there is one more rate than milestones."""

    def __init__(self, optimizer, learning_rates, milestones, param_group_tags=None):
        if len(learning_rates) != len(milestones) + 1:
            raise ValueError("PiecewiseConstantLR needs exactly one more learning rate than milestones")
        self.learning_rates = list(learning_rates)
        self.milestones = list(milestones)
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        lr = torch.full_like(step, self.learning_rates[0])
        for m, rate in zip(self.milestones, self.learning_rates[1:]):
            lr = torch.where(step >= m, torch.full_like(step, rate), lr)
        return lr
