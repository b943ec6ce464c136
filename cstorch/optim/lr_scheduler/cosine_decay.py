"""`CosineDecayLR`: half a cosine from an initial to an end rate."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import CosineDecayScheduler, TagsT, alias


class CosineDecayLR(LRScheduler, CosineDecayScheduler):
    """``end + (initial - end) * (1 + cos(pi * t / total_iters)) / 2`` up to ``total_iters``,
    then ``end_learning_rate``."""

    initial_val = alias("initial_learning_rate")
    end_val = alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float, total_iters: int, param_group_tags: TagsT = None):
        CosineDecayScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                      total_iters, param_group_tags=param_group_tags)
