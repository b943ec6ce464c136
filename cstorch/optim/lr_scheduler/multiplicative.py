"""`MultiplicativeLR`: multiply by a constant factor every step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import MultiplicativeScheduler, TagsT, alias


class MultiplicativeLR(LRScheduler, MultiplicativeScheduler):
    """``initial * coefficient ** t``."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 coefficient: float, param_group_tags: TagsT = None):
        MultiplicativeScheduler.__init__(self, optimizer, initial_learning_rate, coefficient,
                                         param_group_tags=param_group_tags)
