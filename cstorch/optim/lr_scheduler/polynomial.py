"""`PolynomialLR`: polynomial decay from an initial to an end rate."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import PolynomialScheduler, TagsT, alias


class PolynomialLR(LRScheduler, PolynomialScheduler):
    """``(initial - end) * (1 - t / total_iters) ** power + end`` up to ``total_iters``, then
    ``end_learning_rate``. ``cycle=True`` also holds ``end_learning_rate`` after
    ``total_iters``, as the real package does (the decay does not restart)."""

    initial_val = alias("initial_learning_rate")
    end_val = alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, power: float = 1.0,
                 cycle: bool = False, param_group_tags: TagsT = None):
        PolynomialScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                     total_iters, power, cycle,
                                     param_group_tags=param_group_tags)
