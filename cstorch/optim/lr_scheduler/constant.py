"""`ConstantLR`: a fixed rate."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class ConstantLR(LRScheduler):
    """``learning_rate`` at every step (``total_iters`` only bounds it within a SequentialLR)."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 learning_rate, total_iters=None, param_group_tags=None):
        self.learning_rate = learning_rate
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return torch.full_like(step, self.learning_rate)
