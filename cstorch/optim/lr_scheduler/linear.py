"""`LinearLR`: linear interpolation between two rates."""
import torch

from cstorch.optim.lr_scheduler.polynomial import polynomial
from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class LinearLR(LRScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` linearly over ``total_iters``
    steps, then ``end_learning_rate``.

    ``cycle`` is accepted for compatibility; the real package's recorded schedule with
    ``cycle=True`` also holds at ``end_learning_rate`` after ``total_iters``, and so does
    this one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, end_learning_rate, total_iters,
                 cycle=False, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self.cycle = cycle
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return polynomial(step, self.initial_learning_rate, self.end_learning_rate,
                          self.total_iters, 1.0, False)
