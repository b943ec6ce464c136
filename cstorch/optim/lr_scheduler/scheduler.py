"""`LRScheduler`: the base of cstorch's learning-rate schedules.

A `cstorch.optim.scheduler.Scheduler` of the param groups' ``lr``: a closed-form function of
a step counter kept in the optimizer's ``schedule_state``, written as a tensor ``lr`` into
each param group it drives, so `scheduler.step()` inside `@cstorch.trace` advances the
schedule on the device without a new capture, and eagerly it does the same with ordinary
tensors. Each schedule here is the generic one of `cstorch.optim.scheduler` with its
hyperparameters under learning-rate names (``initial_val`` is ``initial_learning_rate``).
"""
import torch

from cstorch.optim.scheduler import Scheduler


class LRScheduler(Scheduler, torch.optim.lr_scheduler._LRScheduler):
    """Base class of the learning-rate schedules: a `Scheduler` of the param groups' "lr".
    As in the real package it is also a torch LR scheduler (``isinstance`` checks of
    torch's class hold); its methods are cstorch's: torch's constructor never runs."""

    @property
    def param_group_key(self):
        """The learning rate: "lr"."""
        return "lr"

    def get_last_lr(self):
        """The rates last written, one per driven param group, as Python floats."""
        return self.get_last_value()

    def get_lr(self):
        """The current rates, one per driven param group (as `get_last_lr()`)."""
        return self.get_last_lr()
