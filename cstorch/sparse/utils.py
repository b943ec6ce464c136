"""Schedules and mask arithmetic the sparsity algorithms share.

Everything here is torch ops on tensors, so one implementation serves eager steps and
traced ones: a schedule receives the step as a float32 tensor (a traced value inside
`@cstorch.trace`) and returns a float32 tensor; a mask is chosen by ranking scores, which
takes the number of elements to keep as a tensor, so a sparsity level that changes with the
step needs no new capture. Nothing here branches on a tensor's value.
"""
import math
import zlib
from abc import ABC, abstractmethod

import torch

# hyperparameter schedules ------------------------------------------------------------------


class HyperParameterSchedule(ABC):
    """A hyperparameter (a sparsity level, a drop fraction) as a function of the step.

    `compute(step)` gets the step as a float32 tensor and returns a tensor, with torch ops
    only (no ``.item()``, no Python branching on the step)."""

    @abstractmethod
    def compute(self, step: torch.Tensor) -> torch.Tensor:
        """The value at `step`."""

    def __call__(self, step) -> torch.Tensor:
        if not isinstance(step, torch.Tensor):
            step = torch.tensor(float(step))
        value = self.compute(step)
        if not isinstance(value, torch.Tensor):
            return torch.full_like(step, float(value))
        return value.to(torch.float32)

    def value_at(self, step: int) -> float:
        """The value at `step` as a Python float (eagerly)."""
        return float(self(torch.tensor(float(step))))


class Constant(HyperParameterSchedule):
    """``value`` at every step."""

    def __init__(self, value: float):
        self.value = float(value)

    def compute(self, step):
        return torch.full_like(step, self.value)


class Linear(HyperParameterSchedule):
    """``init + slope * step``."""

    def __init__(self, init: float, slope: float):
        self.init, self.slope = float(init), float(slope)

    def compute(self, step):
        return self.init + self.slope * step


class Exp(HyperParameterSchedule):
    """From ``init`` towards ``final`` exponentially: ``final + (init - final) *
    exp(-gamma * step)``."""

    def __init__(self, init: float, gamma: float, final: float = 1.0):
        self.init, self.gamma, self.final = float(init), float(gamma), float(final)

    @property
    def scale(self) -> float:
        """How far the schedule travels: ``final - init``."""
        return self.final - self.init

    def compute(self, step):
        return self.final + (self.init - self.final) * torch.exp(-self.gamma * step)


class Power(HyperParameterSchedule):
    """A power law from ``init``: ``init * (step + 1) ** beta`` (``init`` at step 0)."""

    def __init__(self, init: float, beta: float):
        self.init, self.beta = float(init), float(beta)

    def compute(self, step):
        return self.init * torch.pow(step + 1, self.beta)


class Cosine(HyperParameterSchedule):
    """From ``init`` down to ``minimum`` and back along a cosine: ``minimum + (init -
    minimum) * (1 + cos(pi * step / half_period)) / 2``, so ``minimum`` at
    ``half_period``, ``init`` again at ``2 * half_period``."""

    def __init__(self, init: float, half_period: float, minimum: float = 0.0):
        if half_period <= 0:
            raise ValueError(f"Cosine's half_period must be positive, got {half_period}")
        self.init, self.half_period, self.minimum = float(init), float(half_period), float(minimum)

    @property
    def amp(self) -> float:
        """The cosine's amplitude, ``(init - minimum) / 2``."""
        return (self.init - self.minimum) / 2

    @property
    def offset(self) -> float:
        """The value the cosine swings around, ``minimum + amp``."""
        return self.minimum + self.amp

    @property
    def freq(self) -> float:
        """The angular frequency per step, ``pi / half_period``."""
        return math.pi / self.half_period

    def compute(self, step):
        cos = torch.cos(math.pi * step / self.half_period)
        return self.minimum + (self.init - self.minimum) * (1 + cos) / 2


class Cycling(HyperParameterSchedule):
    """``values[step % len(values)]``."""

    def __init__(self, values):
        self.values = [float(v) for v in values]
        if not self.values:
            raise ValueError("Cycling needs at least one value")

    def compute(self, step):
        index = torch.remainder(step, len(self.values))
        value = torch.full_like(step, self.values[0])
        for i, v in enumerate(self.values[1:], 1):
            value = torch.where(index == i, torch.full_like(step, v), value)
        return value


class Lambda(HyperParameterSchedule):
    """``fn(step)``: `fn` gets the step as a float32 tensor and must use torch ops on it."""

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"Lambda needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def compute(self, step):
        return self.fn(step)


class StepValues(HyperParameterSchedule):
    """``values[i]`` from step ``steps[i]`` on (``values[0]`` before ``steps[0]``): a list
    of levels paired with the update steps that switch to them."""

    def __init__(self, values, steps):
        if len(values) != len(steps):
            raise ValueError(f"expected one value per step, got {len(values)} values and "
                             f"{len(steps)} steps")
        self.values, self.steps = [float(v) for v in values], [int(s) for s in steps]

    def compute(self, step):
        value = torch.full_like(step, self.values[0])
        for s, v in zip(self.steps[1:], self.values[1:]):
            value = torch.where(step >= s, torch.full_like(step, v), value)
        return value


SCHEDULE_TYPES = {"constant": Constant, "linear": Linear, "exp": Exp, "power": Power,
                  "cosine": Cosine, "cycling": Cycling, "lambda": Lambda}


def make_hyperparameter_schedule(value, name: str = "hyperparameter") -> HyperParameterSchedule:
    """A schedule from a number (constant), a dict ``{"type": "linear", "init": 0.0,
    "slope": 0.1}`` (types: constant, linear, exp, power, cosine, cycling, lambda), a list
    of numbers (cycling), a callable (lambda), or a schedule (kept)."""
    if isinstance(value, HyperParameterSchedule):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, a schedule dict or a schedule, got {value!r}")
    if isinstance(value, (int, float)):
        return Constant(value)
    if isinstance(value, dict):
        kwargs = dict(value)
        kind = kwargs.pop("type", None)
        if not isinstance(kind, str) or kind.lower() not in SCHEDULE_TYPES:
            raise ValueError(f"{name} schedule {value!r} needs a 'type', one of "
                             f"{sorted(SCHEDULE_TYPES)}")
        cls = SCHEDULE_TYPES[kind.lower()]
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise TypeError(f"{name} schedule {value!r}: {e}") from None
    if isinstance(value, (list, tuple)):
        return Cycling(value)
    if callable(value):
        return Lambda(value)
    raise TypeError(f"{name} must be a number, a schedule dict, a list, a callable or a "
                    f"HyperParameterSchedule, got {type(value).__name__}")


# update schedules --------------------------------------------------------------------------


class UpdateSchedule(ABC):
    """When a dynamic algorithm updates its masks: `__call__(step)` is a bool tensor of the
    step (the number of optimizer steps taken, from 1 after the first)."""

    @abstractmethod
    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        """Whether `step` is an update step."""


class FreqSchedule(UpdateSchedule):
    """Every ``freq`` steps from ``start`` (``start``, ``start + freq``, ...), before
    ``stop`` when given."""

    def __init__(self, freq: int = 1, start: int = 0, stop=None):
        for label, v in (("freq", freq), ("start", start)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"update {label} must be an integer, got {v!r}")
        if freq < 1:
            raise ValueError(f"update freq must be at least 1, got {freq}")
        if start < 0:
            raise ValueError(f"update start must not be negative, got {start}")
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int)
                                 or stop <= start):
            raise ValueError(f"update stop must be an integer after start ({start}), got {stop!r}")
        self.freq, self.start, self.stop = freq, start, stop

    def __call__(self, step):
        hit = (step >= self.start) & (torch.remainder(step - self.start, self.freq) == 0)
        if self.stop is not None:
            hit = hit & (step < self.stop)
        return hit


class ListSchedule(UpdateSchedule):
    """At the listed steps."""

    def __init__(self, steps):
        steps = list(steps)
        if not steps or any(isinstance(s, bool) or not isinstance(s, int) for s in steps):
            raise TypeError(f"update steps must be a non-empty list of integers, got {steps!r}")
        self.steps = sorted(steps)

    def __call__(self, step):
        hit = step == self.steps[0]
        for s in self.steps[1:]:
            hit = hit | (step == s)
        return hit


class _Callable(UpdateSchedule):
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, step):
        return torch.as_tensor(self.fn(step)).to(torch.bool)


def make_update_schedule(update) -> UpdateSchedule:
    """An update schedule from None (every step), an int (every that many steps), a dict
    ``{"freq": 100, "start": 0, "stop": 3000}`` or ``{"steps": [10, 20]}``, a callable of
    the step tensor, or an `UpdateSchedule` (kept)."""
    if update is None:
        return FreqSchedule()
    if isinstance(update, UpdateSchedule):
        return update
    if isinstance(update, int) and not isinstance(update, bool):
        return FreqSchedule(freq=update)
    if isinstance(update, dict):
        keys = set(update)
        if "steps" in keys:
            if keys != {"steps"}:
                raise ValueError(f"an update with 'steps' takes nothing else, got {sorted(keys)}")
            return ListSchedule(update["steps"])
        unknown = keys - {"freq", "start", "stop"}
        if unknown:
            raise ValueError(f"unknown update keys {sorted(unknown)}: an update is "
                             "{'freq', 'start', 'stop'} or {'steps'}")
        return FreqSchedule(**update)
    if callable(update):
        return _Callable(update)
    raise TypeError("update must be None, an int, a dict or a callable, got "
                    f"{type(update).__name__}")


# masks ---------------------------------------------------------------------------------------


def keep_count(numel: int, sparsity) -> torch.Tensor:
    """How many of `numel` elements a `sparsity` level keeps: ``floor((1 - sparsity) *
    numel)`` in float32 arithmetic, as the reference (44 of 64 at 0.3), as a float32
    tensor (the level clamped to [0, 1])."""
    sparsity = torch.as_tensor(sparsity, dtype=torch.float32)
    return torch.floor((1 - torch.clamp(sparsity, 0.0, 1.0)) * numel)


def top_ranked(score: torch.Tensor, k) -> torch.Tensor:
    """A bool mask of the `k` highest scores (`k` a number or a tensor); equal scores are
    taken in element order, so eager and traced steps choose alike."""
    flat = score.reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    ranks = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(),
                                                                    dtype=order.dtype))
    return (ranks < k).reshape(score.shape)


_MIX = (0x2545F491, 0x5BD1E995, 0x27D4EB2F, 0x165667B1)


def name_seed(name: str) -> int:
    """A stable per-name seed (not Python's salted `hash`)."""
    return zlib.crc32(name.encode()) & 0x3FFFFFFF


def hash_uniform(shape, seed: int, step) -> torch.Tensor:
    """Pseudo-random floats in [0, 1) of `shape`, a function of (`seed`, `step`, element):
    int32 arithmetic that wraps the same way in torch and in XLA, so an eager step and a
    traced one draw the same numbers (random ops inside a traced step draw from JAX's
    generator instead, which torch's cannot reproduce)."""
    n = math.prod(shape)
    step = torch.as_tensor(step).to(torch.int32)
    h = torch.arange(n, dtype=torch.int32) * _MIX[0] + step * _MIX[1] + (seed & 0x3FFFFFFF)
    h = h ^ torch.bitwise_right_shift(h, 15)
    h = h * _MIX[2]
    h = h ^ torch.bitwise_right_shift(h, 13)
    h = h * _MIX[3]
    h = h ^ torch.bitwise_right_shift(h, 16)
    return ((h & 0xFFFFFF).to(torch.float32) / float(1 << 24)).reshape(tuple(shape))
