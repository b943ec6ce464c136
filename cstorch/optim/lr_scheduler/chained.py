"""`ChainedLR` (and its older name `ChainedScheduler`): learning-rate schedules at once."""

from cstorch.optim import scheduler
from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import TagsT


class ChainedLR(LRScheduler, scheduler.ChainedScheduler):
    """The first schedule's rate times each later one's rate divided by that one's initial
    rate, at the same step (all must drive the same optimizer). Only the chained schedule
    needs stepping."""

    def __init__(self, schedulers: list[LRScheduler], param_group_tags: TagsT = None):
        scheduler.ChainedScheduler.__init__(self, schedulers, param_group_tags=param_group_tags)


class ChainedScheduler(ChainedLR):
    """`ChainedLR` under the name the real package also exports."""
