"""`PolynomialLR`: polynomial decay from an initial to an end rate."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


def polynomial(step, initial, end, total_iters, power, cycle):
    if cycle:
        # Restart with a longer horizon, as TensorFlow's polynomial decay does:
        # the horizon is total_iters times the number of periods begun.
        periods = torch.clamp(torch.ceil(step / total_iters), min=1.0)
        progress = step / (periods * total_iters)
    else:
        progress = torch.clamp(step, max=float(total_iters)) / total_iters
    return (initial - end) * torch.pow(1 - progress, power) + end


class PolynomialLR(LRScheduler):
    """``(initial - end) * (1 - t / total_iters) ** power + end`` up to ``total_iters``, then
    ``end_learning_rate``; with ``cycle`` the decay restarts over a horizon stretched to the
    next multiple of ``total_iters``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate, end_learning_rate, total_iters, power=1.0,
                 cycle=False, param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.cycle = cycle
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return polynomial(step, self.initial_learning_rate, self.end_learning_rate,
                          self.total_iters, self.power, self.cycle)
