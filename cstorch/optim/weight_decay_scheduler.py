"""`cerebras.pytorch.optim.weight_decay_scheduler`: schedules of the param groups'
``weight_decay``.

`WeightDecayScheduler` is a `cstorch.optim.scheduler.Scheduler` of the ``"weight_decay"``
key: its counter is device state and the value is written as a tensor into each driven
param group, so it steps inside `@cstorch.trace` without a new capture, with the same
values as eagerly. The optimizers apply a tensor ``weight_decay`` whatever its value
(a schedule may start at 0).

The counterparts of the learning-rate schedules use their formulas, with the learning rate
arguments renamed as the real package names them (``initial_learning_rate`` ->
``initial_val``, ``end_learning_rate`` -> ``end_val``, ``learning_rate`` -> ``val``,
``learning_rates`` -> ``values``): ``CosineDecayWD(optimizer, initial_val=0.04,
end_val=0.4, total_iters=...)`` as Model Zoo's configs write it. Cyclic, one-cycle and
lambda weight-decay schedules are not provided.
"""
from typing import List

import torch

from cstorch.optim import lr_scheduler as _lr
from cstorch.optim.scheduler import (ChainedScheduler, PiecewiseConstantScheduler, Scheduler,
                                     SequentialScheduler)


class WeightDecayScheduler(Scheduler):
    """Base class of weight-decay schedules: subclasses implement `value_at(step)` (torch
    ops on the float32 step tensor). ``param_group_tags`` selects the driven param groups
    as for the LR schedules."""

    param_group_key = "weight_decay"

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters=None, last_epoch=-1,
                 param_group_tags=None):
        super().__init__(optimizer, total_iters, last_epoch, param_group_tags=param_group_tags)


class _Formula:
    """Mixin of a weight-decay schedule whose value is an LR schedule's formula:
    `_lr_class`'s `lr_at` evaluated on a holder carrying that class's attribute names."""

    _lr_class = None

    def _init(self, optimizer, total_iters, param_group_tags, **attrs):
        holder = object.__new__(self._lr_class)
        holder.__dict__.update(attrs, total_iters=total_iters)
        self._formula = holder
        WeightDecayScheduler.__init__(self, optimizer, total_iters,
                                      param_group_tags=param_group_tags)

    def value_at(self, step):
        return self._lr_class.lr_at(self._formula, step)


class ConstantWD(_Formula, WeightDecayScheduler):
    """``val`` at every step (``total_iters`` only bounds it within a SequentialWD)."""
    _lr_class = _lr.ConstantLR

    def __init__(self, optimizer: torch.optim.Optimizer, val: float, total_iters=None,
                 param_group_tags=None):
        self.val = val
        self._init(optimizer, total_iters, param_group_tags, learning_rate=val)


class PolynomialWD(_Formula, WeightDecayScheduler):
    """``(initial - end) * (1 - t / total_iters) ** power + end`` up to ``total_iters``,
    then ``end_val`` (``cycle`` as in `PolynomialLR`)."""
    _lr_class = _lr.PolynomialLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False,
                 param_group_tags=None):
        self.initial_val, self.end_val, self.power, self.cycle = initial_val, end_val, power, cycle
        self._init(optimizer, total_iters, param_group_tags, initial_learning_rate=initial_val,
                         end_learning_rate=end_val, power=power, cycle=cycle)


class LinearWD(PolynomialWD):
    """From ``initial_val`` to ``end_val`` linearly over ``total_iters`` steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, cycle: bool = False, param_group_tags=None):
        super().__init__(optimizer, initial_val, end_val, total_iters, 1.0, cycle,
                         param_group_tags=param_group_tags)


class ExponentialWD(_Formula, WeightDecayScheduler):
    """``initial_val * decay_rate ** (t / total_iters)`` (floored exponent with
    ``staircase``)."""
    _lr_class = _lr.ExponentialLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags=None):
        self.initial_val, self.decay_rate, self.staircase = initial_val, decay_rate, staircase
        self._init(optimizer, total_iters, param_group_tags, initial_learning_rate=initial_val,
                         decay_rate=decay_rate, staircase=staircase)


class InverseExponentialTimeDecayWD(_Formula, WeightDecayScheduler):
    """``initial_val / (1 + decay_rate * t ** step_exponent / total_iters)`` (floored ratio
    with ``staircase``)."""
    _lr_class = _lr.InverseExponentialTimeDecayLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags=None):
        self.initial_val, self.step_exponent = initial_val, step_exponent
        self.decay_rate, self.staircase = decay_rate, staircase
        self._init(optimizer, total_iters, param_group_tags, initial_learning_rate=initial_val,
                         step_exponent=step_exponent, decay_rate=decay_rate, staircase=staircase)


class InverseSquareRootDecayWD(_Formula, WeightDecayScheduler):
    """``initial_val * scale / sqrt(max(t, warmup_steps))``."""
    _lr_class = _lr.InverseSquareRootDecayLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float = 1.0,
                 scale: float = 1.0, warmup_steps: int = 1, param_group_tags=None):
        self.initial_val, self.scale, self.warmup_steps = initial_val, scale, warmup_steps
        self._init(optimizer, None, param_group_tags, initial_learning_rate=initial_val,
                         scale=scale, warmup_steps=warmup_steps)


class CosineDecayWD(_Formula, WeightDecayScheduler):
    """``end + (initial - end) * (1 + cos(pi * t / total_iters)) / 2`` up to
    ``total_iters``, then ``end_val``."""
    _lr_class = _lr.CosineDecayLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, param_group_tags=None):
        self.initial_val, self.end_val = initial_val, end_val
        self._init(optimizer, total_iters, param_group_tags, initial_learning_rate=initial_val,
                         end_learning_rate=end_val)


class CosineAnnealingWD(_Formula, WeightDecayScheduler):
    """``eta_min + (initial_val - eta_min) * (1 + cos(pi * t / T_max)) / 2`` for every t."""
    _lr_class = _lr.CosineAnnealingLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_max: int,
                 eta_min: float = 0.0, param_group_tags=None):
        self.initial_val, self.T_max, self.eta_min = initial_val, T_max, eta_min
        self._init(optimizer, T_max, param_group_tags, initial_learning_rate=initial_val,
                         T_max=T_max, eta_min=eta_min)


class StepWD(_Formula, WeightDecayScheduler):
    """``initial_val * gamma ** floor(t / step_size)``."""
    _lr_class = _lr.StepLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_size: int,
                 gamma: float, param_group_tags=None):
        self.initial_val, self.step_size, self.gamma = initial_val, step_size, gamma
        self._init(optimizer, None, param_group_tags, initial_learning_rate=initial_val,
                         step_size=step_size, gamma=gamma)


class MultiStepWD(_Formula, WeightDecayScheduler):
    """``initial_val * gamma ** (number of milestones <= t)``."""
    _lr_class = _lr.MultiStepLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, gamma: float,
                 milestones: List[int], param_group_tags=None):
        self.initial_val, self.gamma, self.milestones = initial_val, gamma, sorted(milestones)
        self._init(optimizer, None, param_group_tags, initial_learning_rate=initial_val,
                         gamma=gamma, milestones=sorted(milestones))


class MultiplicativeWD(_Formula, WeightDecayScheduler):
    """``initial_val * coefficient ** t``."""
    _lr_class = _lr.MultiplicativeLR

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, coefficient: float,
                 param_group_tags=None):
        self.initial_val, self.coefficient = initial_val, coefficient
        self._init(optimizer, None, param_group_tags, initial_learning_rate=initial_val,
                         coefficient=coefficient)


class SequentialWD(WeightDecayScheduler, SequentialScheduler):
    """Weight-decay schedules one after another (`SequentialScheduler`)."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 schedulers: List[WeightDecayScheduler], milestones=None, last_epoch=-1,
                 param_group_tags=None):
        SequentialScheduler.__init__(self, optimizer, schedulers, milestones, last_epoch,
                                     param_group_tags=param_group_tags)


class PiecewiseConstantWD(WeightDecayScheduler, PiecewiseConstantScheduler):
    """``values[i]`` where i is the number of ``milestones`` reached."""

    def __init__(self, optimizer: torch.optim.Optimizer, values: List[float],
                 milestones: List[int], param_group_tags=None):
        PiecewiseConstantScheduler.__init__(self, optimizer, values, milestones,
                                            param_group_tags=param_group_tags)


class ChainedWD(WeightDecayScheduler, ChainedScheduler):
    """The product of its weight-decay schedules' values at the same step."""

    def __init__(self, schedulers: List[WeightDecayScheduler], param_group_tags=None):
        ChainedScheduler.__init__(self, schedulers, param_group_tags=param_group_tags)


__all__ = ["WeightDecayScheduler", "ConstantWD", "PolynomialWD", "LinearWD", "ExponentialWD",
           "InverseExponentialTimeDecayWD", "InverseSquareRootDecayWD", "CosineDecayWD",
           "CosineAnnealingWD", "StepWD", "MultiStepWD", "MultiplicativeWD", "SequentialWD",
           "PiecewiseConstantWD", "ChainedWD"]
