"""`LambdaLR`: an initial rate times a function of the step."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.scheduler import LambdaScheduler, TagsT, alias


class LambdaLR(LRScheduler, LambdaScheduler):
    """``initial_learning_rate`` times the function(s) of the step that
    `set_value_lambda()` returns (see `cstorch.optim.scheduler.LambdaScheduler`); a subclass
    overrides `set_value_lambda()` to give its own. Unlike torch's LambdaLR the second
    argument is the initial rate, not a function."""

    initial_val = alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 param_group_tags: TagsT = None):
        LambdaScheduler.__init__(self, optimizer, initial_learning_rate,
                                 param_group_tags=param_group_tags)
