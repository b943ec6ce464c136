"""`cerebras.pytorch.optim.weight_decay_scheduler`: schedules of the param groups'
``weight_decay``.

`WeightDecayScheduler` is a `cstorch.optim.scheduler.Scheduler` of the ``"weight_decay"``
key: its counter is device state and the value is written as a tensor into each driven
param group, so it steps inside `@cstorch.trace` without a new capture, with the same
values as eagerly. The optimizers apply a tensor ``weight_decay`` whatever its value (a
schedule may start at 0).

Each schedule is the generic one of `cstorch.optim.scheduler` under its generic
hyperparameter names (``initial_val``, ``end_val``, ``val``, ``base_val``, ``max_val``):
``CosineDecayWD(optimizer, initial_val=0.04, end_val=0.4, total_iters=...)`` as Model Zoo's
configs write it. The generic ``*Scheduler`` bases are exported here too.
"""

import torch

from cstorch.optim.scheduler import (
    Scheduler, ChainedScheduler, ConstantScheduler, PolynomialScheduler, LinearScheduler,
    ExponentialScheduler, InverseExponentialTimeDecayScheduler, InverseSquareRootDecayScheduler,
    CosineDecayScheduler, CosineAnnealingScheduler, CosineAnnealingWarmRestartsScheduler,
    StepScheduler, MultiStepScheduler, MultiplicativeScheduler, LambdaScheduler,
    CyclicScheduler, OneCycleScheduler, SequentialScheduler, PiecewiseConstantScheduler,
    ScalePerParamScheduler, TagsT)


class WeightDecayScheduler(Scheduler):
    """Base class of the weight-decay schedules: a `Scheduler` of the param groups'
    "weight_decay"."""

    @property
    def param_group_key(self):
        """The weight decay: "weight_decay"."""
        return "weight_decay"


class ConstantWD(WeightDecayScheduler, ConstantScheduler):
    """``val`` at every step (``total_iters`` only bounds it within a SequentialWD)."""


class PolynomialWD(WeightDecayScheduler, PolynomialScheduler):
    """``(initial_val - end_val) * (1 - t / total_iters) ** power + end_val`` up to
    ``total_iters``, then ``end_val`` (also with ``cycle=True``, as in the real package)."""


class LinearWD(WeightDecayScheduler, LinearScheduler):
    """From ``initial_val`` to ``end_val`` linearly over ``total_iters`` steps, then
    ``end_val``."""


class ExponentialWD(WeightDecayScheduler, ExponentialScheduler):
    """``initial_val * decay_rate ** (t / total_iters)`` (floored exponent with
    ``staircase``)."""


class InverseExponentialTimeDecayWD(WeightDecayScheduler, InverseExponentialTimeDecayScheduler):
    """``initial_val / (1 + decay_rate * t ** step_exponent / total_iters)`` (floored ratio
    with ``staircase``)."""


class InverseSquareRootDecayWD(WeightDecayScheduler, InverseSquareRootDecayScheduler):
    """``initial_val * scale / sqrt(max(t, warmup_steps))``."""


class CosineDecayWD(WeightDecayScheduler, CosineDecayScheduler):
    """``end_val + (initial_val - end_val) * (1 + cos(pi * t / total_iters)) / 2`` up to
    ``total_iters``, then ``end_val``."""


class CosineAnnealingWD(WeightDecayScheduler, CosineAnnealingScheduler):
    """``eta_min + (initial_val - eta_min) * (1 + cos(pi * t / T_max)) / 2`` for every t."""


class CosineAnnealingWarmRestartsWD(WeightDecayScheduler, CosineAnnealingWarmRestartsScheduler):
    """The cosine from ``initial_val`` towards ``eta_min``, restarting every ``T_0`` steps
    (``T_mult`` must be 1); see docs/compat.md for the real package's flat periods."""


class StepWD(WeightDecayScheduler, StepScheduler):
    """``initial_val * gamma ** floor(t / step_size)``."""


class MultiStepWD(WeightDecayScheduler, MultiStepScheduler):
    """``initial_val * gamma ** (number of milestones <= t)``."""


class MultiplicativeWD(WeightDecayScheduler, MultiplicativeScheduler):
    """``initial_val * coefficient ** t``."""


class LambdaWD(WeightDecayScheduler, LambdaScheduler):
    """``initial_val`` times the function(s) of the step `set_value_lambda()` returns."""


class CyclicWD(WeightDecayScheduler, CyclicScheduler):
    """Cyclical weight decay between ``base_val`` and ``max_val`` (as `CyclicLR`)."""


class OneCycleWD(WeightDecayScheduler, OneCycleScheduler):
    """The 1cycle policy from ``initial_val`` up to ``max_val`` and down to
    ``initial_val / final_div_factor`` (as `OneCycleLR`)."""


class SequentialWD(WeightDecayScheduler, SequentialScheduler):
    """Weight-decay schedules one after another, each from its own step 0."""


class PiecewiseConstantWD(WeightDecayScheduler, PiecewiseConstantScheduler):
    """``vals[i]`` where i is the number of ``milestones`` reached."""

    def __init__(self, optimizer: torch.optim.Optimizer, vals: list[float],
                 milestones: list[int], param_group_tags: TagsT = None):
        PiecewiseConstantScheduler.__init__(self, optimizer, ConstantWD, vals, milestones,
                                            param_group_tags=param_group_tags)


class ChainedWD(WeightDecayScheduler, ChainedScheduler):
    """The first weight-decay schedule's value times each later one's value divided by
    that one's initial value, at the same step."""


class ScalePerParamWD(WeightDecayScheduler, ScalePerParamScheduler):
    """``scheduler``'s value for each param group times the group's ``"adjust_val"`` entry
    (1 where a group has none), read when this schedule is made."""


__all__ = ["WeightDecayScheduler", "ConstantWD", "PolynomialWD", "LinearWD", "ExponentialWD",
           "InverseExponentialTimeDecayWD", "InverseSquareRootDecayWD", "CosineDecayWD",
           "CosineAnnealingWD", "CosineAnnealingWarmRestartsWD", "StepWD", "MultiStepWD",
           "MultiplicativeWD", "LambdaWD", "CyclicWD", "OneCycleWD", "SequentialWD",
           "PiecewiseConstantWD", "ChainedWD", "ScalePerParamWD",
           "Scheduler", "ChainedScheduler", "ConstantScheduler", "PolynomialScheduler",
           "LinearScheduler", "ExponentialScheduler", "InverseExponentialTimeDecayScheduler",
           "InverseSquareRootDecayScheduler", "CosineDecayScheduler", "CosineAnnealingScheduler",
           "CosineAnnealingWarmRestartsScheduler", "StepScheduler", "MultiStepScheduler",
           "MultiplicativeScheduler", "LambdaScheduler", "CyclicScheduler", "OneCycleScheduler",
           "SequentialScheduler", "PiecewiseConstantScheduler", "ScalePerParamScheduler"]
