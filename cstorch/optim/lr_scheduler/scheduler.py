"""`LRScheduler`: the base of cstorch's learning-rate schedules.

A `cstorch.optim.scheduler.Scheduler` of the param groups' ``lr``: a closed-form function of
a step counter kept in the optimizer's ``schedule_state``, written as a tensor ``lr`` into
each param group it drives, so `scheduler.step()` inside `@cstorch.trace` advances the
schedule on the device without a new capture, and eagerly it does the same with ordinary
tensors.
"""
import math

import torch

from cstorch.optim.scheduler import Scheduler


class LRScheduler(Scheduler):
    """Base class: subclasses implement `lr_at(step)`, the rate after `step` calls of
    `step()`, as torch ops on the float32 tensor `step` (or `values_at(step)` for a rate
    per param group).

    ``param_group_tags`` (a tag or a collection of tags) limits the schedule to the param
    groups whose ``"tags"`` entry shares one of them; ``None`` drives every group. Right
    after construction each driven group's ``lr`` is the rate at step 0.
    """

    param_group_key = "lr"
    _base_name = "base_lrs"

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters=None, last_epoch=-1,
                 param_group_tags=None):
        super().__init__(optimizer, total_iters, last_epoch, param_group_tags=param_group_tags)

    @property
    def base_lrs(self):
        """Each driven group's rate when the scheduler was made."""
        return self.base_values

    @base_lrs.setter
    def base_lrs(self, values):
        self.base_values = list(values)

    # the schedule -----------------------------------------------------------------------
    def lr_at(self, step: torch.Tensor) -> torch.Tensor:
        """The rate at `step` (a float32 tensor), as a tensor."""
        raise NotImplementedError(f"{type(self).__name__} does not implement lr_at(step)")

    def value_at(self, step):
        return self.lr_at(step)

    def lrs_at(self, step):
        """One rate per driven param group."""
        return self.values_at(step)

    def get_last_lr(self):
        """The rates last written, one per driven param group, as Python floats."""
        return self.get_last_value()

    def get_lr(self):
        return self.get_last_lr()


def clamp_steps(step, total_iters):
    return torch.clamp(step, max=float(total_iters))


def cosine(progress):
    """``(1 + cos(pi * progress)) / 2``."""
    return (1 + torch.cos(math.pi * progress)) / 2
