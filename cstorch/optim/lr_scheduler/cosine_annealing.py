"""`CosineAnnealingLR`: the SGDR cosine, periodic."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler, cosine


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (initial - eta_min) * (1 + cos(pi * t / T_max)) / 2`` for every t: down to
    ``eta_min`` at ``T_max``, back up to the initial rate at ``2 * T_max``, and so on."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, T_max, eta_min=0.0, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, T_max, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * cosine(step / self.T_max)
