"""`ExponentialLR`: exponential decay."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class ExponentialLR(LRScheduler):
    """``initial * decay_rate ** (t / total_iters)``; with ``staircase`` the exponent is
    floored, so the rate drops once every ``total_iters`` steps."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, total_iters, decay_rate, staircase=False,
                 param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.decay_rate = decay_rate
        self.staircase = staircase
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        exponent = step / self.total_iters
        if self.staircase:
            exponent = torch.floor(exponent)
        return self.initial_learning_rate * torch.pow(self.decay_rate, exponent)
