"""`ChainedScheduler`: several learning-rate schedules applied together."""
from typing import List

from cstorch.optim import scheduler
from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class ChainedScheduler(LRScheduler, scheduler.ChainedScheduler):
    """The product of its schedulers' rates at the same step (all must drive the same
    optimizer). Give one schedule the absolute rate and the others ``initial_learning_rate
    = 1.0`` to use them as factors, as chaining torch's multiplicative schedules does."""

    def __init__(self, schedulers: List[LRScheduler], param_group_tags=None):
        scheduler.ChainedScheduler.__init__(self, schedulers, param_group_tags=param_group_tags)
