"""`MultiStepLR`: decay by ``gamma`` at each milestone."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


def milestones_passed(step, milestones):
    count = torch.zeros_like(step)
    for m in milestones:
        count = count + (step >= m).to(step.dtype)
    return count


class MultiStepLR(LRScheduler):
    """``initial * gamma ** (number of milestones <= t)``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, gamma, milestones, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.gamma = gamma
        self.milestones = sorted(milestones)
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return self.initial_learning_rate * torch.pow(self.gamma, milestones_passed(step, self.milestones))
