"""`CosineAnnealingLR`: the SGDR cosine, periodic."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import CosineAnnealingScheduler, TagsT, alias


class CosineAnnealingLR(LRScheduler, CosineAnnealingScheduler):
    """``eta_min + (initial - eta_min) * (1 + cos(pi * t / T_max)) / 2`` for every t: down to
    ``eta_min`` at ``T_max``, back up to the initial rate at ``2 * T_max``, and so on."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 T_max: int, eta_min: float = 0.0, param_group_tags: TagsT = None):
        CosineAnnealingScheduler.__init__(self, optimizer, initial_learning_rate, T_max, eta_min,
                                          param_group_tags=param_group_tags)
