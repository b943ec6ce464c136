"""`CosineDecayLR`: half a cosine from an initial to an end rate."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler, clamp_steps, cosine


class CosineDecayLR(LRScheduler):
    """``end + (initial - end) * (1 + cos(pi * t / total_iters)) / 2`` up to ``total_iters``,
    then ``end_learning_rate``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, end_learning_rate, total_iters,
                 param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        progress = clamp_steps(step, self.total_iters) / self.total_iters
        return self.end_learning_rate + (self.initial_learning_rate - self.end_learning_rate) * cosine(progress)
