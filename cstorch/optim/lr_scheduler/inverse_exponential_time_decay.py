"""`InverseExponentialTimeDecayLR`: inverse time decay with an exponent on the step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class InverseExponentialTimeDecayLR(LRScheduler):
    """``initial / (1 + decay_rate * t ** step_exponent / total_iters)``; with ``staircase``
    the ratio ``t ** step_exponent / total_iters`` is floored."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, step_exponent, total_iters, decay_rate,
                 staircase=False, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.step_exponent = step_exponent
        self.decay_rate = decay_rate
        self.staircase = staircase
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        ratio = torch.pow(step, self.step_exponent) / self.total_iters
        if self.staircase:
            ratio = torch.floor(ratio)
        return self.initial_learning_rate / (1 + self.decay_rate * ratio)
