"""`CosineAnnealingWarmRestarts`: the SGDR cosine, restarting every ``T_0`` steps."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import CosineAnnealingWarmRestartsScheduler, TagsT, alias


class CosineAnnealingWarmRestarts(LRScheduler, CosineAnnealingWarmRestartsScheduler):
    """``eta_min + (initial - eta_min) * (1 + cos(pi * T_cur / T_0)) / 2`` with ``T_cur``
    the steps since the last restart: the rate falls from ``initial_learning_rate`` towards
    ``eta_min`` over ``T_0`` steps and restarts, as torch's CosineAnnealingWarmRestarts with
    ``T_mult=1`` (the only ``T_mult`` the real package accepts). The real package holds the
    rate flat after its first period; see docs/compat.md."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_0: int,
                 T_mult: int = 1, eta_min: float = 0.0, param_group_tags: TagsT = None):
        CosineAnnealingWarmRestartsScheduler.__init__(
            self, optimizer, initial_learning_rate, T_0, T_mult, eta_min,
            param_group_tags=param_group_tags)
