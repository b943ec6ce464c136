"""`LinearLR`: linear interpolation between two rates."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import LinearScheduler, TagsT, alias


class LinearLR(LRScheduler, LinearScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` linearly over ``total_iters``
    steps, then ``end_learning_rate`` (with ``cycle=True`` too, as in the real package)."""

    initial_val = alias("initial_learning_rate")
    end_val = alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, cycle: bool = False,
                 param_group_tags: TagsT = None):
        LinearScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                 total_iters, cycle, param_group_tags=param_group_tags)
