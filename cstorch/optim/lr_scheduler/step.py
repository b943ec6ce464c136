"""`StepLR`: decay by ``gamma`` every ``step_size`` steps."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class StepLR(LRScheduler):
    """``initial * gamma ** floor(t / step_size)``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, step_size, gamma, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return self.initial_learning_rate * torch.pow(self.gamma, torch.floor(step / self.step_size))
