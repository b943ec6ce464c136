"""`MultiplicativeLR`: multiply by a constant factor every step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class MultiplicativeLR(LRScheduler):
    """``initial * coefficient ** t``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, coefficient, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.coefficient = coefficient
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return self.initial_learning_rate * torch.pow(self.coefficient, step)
