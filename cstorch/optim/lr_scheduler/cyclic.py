"""`CyclicLR`: cyclical learning rates (Smith, 2017)."""

import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import CyclicScheduler, TagsT, alias


class CyclicLR(LRScheduler, CyclicScheduler):
    """Between ``base_lr`` and ``max_lr``: up over ``step_size_up`` steps, down over
    ``step_size_down`` (default: the same). ``mode`` scales the amplitude: "triangular"
    (constant), "triangular2" (halved every cycle), "exp_range" (``gamma ** t``); as in
    torch, each mode fixes ``scale_mode``."""

    base_val = alias("base_lr")
    max_val = alias("max_lr")

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, max_lr: float,
                 step_size_up: int = 2000, step_size_down: int | None = None,
                 mode: str = "triangular", gamma: float = 1.0, scale_mode: str = "cycle",
                 param_group_tags: TagsT = None):
        CyclicScheduler.__init__(self, optimizer, base_lr, max_lr, step_size_up, step_size_down,
                                 mode, gamma, scale_mode, param_group_tags=param_group_tags)
