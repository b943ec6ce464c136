"""`ScalePerParamLR`: another schedule's rate scaled per param group (muP)."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class ScalePerParamLR(LRScheduler):
    """``scheduler``'s rate for each param group times the group's
    ``"adjust_learning_rate"`` entry (1 where a group has none), as muP's per-layer
    learning-rate multipliers need. The wrapped scheduler only supplies its formula; this
    scheduler's own counter drives it, and only this one needs stepping.

    The factor is read from the param group at every step, so a float factor is an input
    of a traced step like any float hyperparameter (changing it reuses the program)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 param_group_tags=None):
        if not isinstance(scheduler, LRScheduler):
            raise TypeError("ScalePerParamLR wraps a cstorch.optim.lr_scheduler.LRScheduler, "
                            f"got {type(scheduler).__name__}")
        if scheduler.optimizer is not optimizer:
            raise ValueError("ScalePerParamLR's scheduler must drive the same optimizer")
        if param_group_tags is None:
            param_group_tags = scheduler.param_group_tags
        self.scheduler = scheduler
        super().__init__(optimizer, scheduler.total_iters, param_group_tags=param_group_tags)
        missing = [g for g in self._groups if g not in scheduler._groups]
        if missing:
            raise ValueError(f"ScalePerParamLR drives param groups {missing} that its "
                             "scheduler does not; give both the same param_group_tags")

    def values_at(self, step):
        inner = dict(zip(self.scheduler._groups, self.scheduler.values_at(step)))
        values = []
        for g in self._groups:
            factor = self.optimizer.param_groups[g].get("adjust_learning_rate", 1.0)
            values.append(inner[g] * factor)
        return values
