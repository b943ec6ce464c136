"""`ScalePerParamLR`: another schedule's rate scaled per param group (muP)."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import ScalePerParamScheduler, TagsT, alias


class ScalePerParamLR(LRScheduler, ScalePerParamScheduler):
    """``scheduler``'s rate for each param group times the group's
    ``"adjust_learning_rate"`` entry (1 where a group has none), read when this schedule is
    made, as muP's per-layer learning-rate multipliers need. The wrapped scheduler only
    supplies its formula; only this one needs stepping."""

    adjustment_scalars = alias("lr_adjustment_scalars")
    _adjust_key = "adjust_learning_rate"

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 param_group_tags: TagsT = None):
        ScalePerParamScheduler.__init__(self, optimizer, scheduler,
                                        param_group_tags=param_group_tags)
