"""`OneCycleLR`: the 1cycle policy (Smith & Topin, 2018)."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import OneCycleScheduler, TagsT, alias


class OneCycleLR(LRScheduler, OneCycleScheduler):
    """Warm up from ``initial_learning_rate`` to ``max_lr`` until step
    ``pct_start * total_steps - 1``, then anneal to ``initial_learning_rate /
    final_div_factor`` at ``total_steps - 1`` (``three_phase``: back down to the initial
    rate first). ``anneal_strategy`` is "cos" or "linear"."""

    initial_val = alias("initial_learning_rate")
    max_val = alias("max_lr")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 max_lr: float, total_steps: int = 1000, pct_start: float = 0.3,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 anneal_strategy: str = "cos", param_group_tags: TagsT = None):
        OneCycleScheduler.__init__(self, optimizer, initial_learning_rate, max_lr, total_steps,
                                   pct_start, final_div_factor, three_phase, anneal_strategy,
                                   param_group_tags=param_group_tags)
