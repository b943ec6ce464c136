"""`ChainedScheduler`: several schedules applied together."""
from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class ChainedScheduler(LRScheduler):
    """The product of its schedulers' rates at the same step (all must drive the same
    optimizer). Give one schedule the absolute rate and the others ``initial_learning_rate
    = 1.0`` to use them as factors, as chaining torch's multiplicative schedules does."""

    def __init__(self, schedulers, param_group_tags=None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler needs at least one scheduler")
        optimizer = schedulers[0].optimizer
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("ChainedScheduler's schedulers must all drive the same optimizer")
        self.schedulers = schedulers
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lrs_at(self, step):
        lrs = self.schedulers[0].lrs_at(step)
        for scheduler in self.schedulers[1:]:
            lrs = [a * b for a, b in zip(lrs, scheduler.lrs_at(step))]
        return lrs
