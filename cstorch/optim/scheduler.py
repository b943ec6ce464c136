"""`cerebras.pytorch.optim.scheduler`: schedules of one optimizer param-group value.

A `Scheduler` drives one key of the optimizer's param groups (its ``param_group_key``:
"lr" in `cstorch.optim.lr_scheduler`, "weight_decay" in
`cstorch.optim.weight_decay_scheduler`) as a closed-form function of a step counter. The
counter is a tensor kept in the optimizer's ``schedule_state`` (device state, bound into a
traced step like the optimizer's own state) and the value is written as a tensor into each
param group the schedule drives, so `scheduler.step()` inside `@cstorch.trace` advances the
schedule on the device without a new capture; eagerly it runs the same torch ops, so traced
and eager values agree step by step.

The classes here are abstract: they hold the formulas under generic names (``initial_val``,
``end_val``, ``val``, ...) and leave ``param_group_key`` to a subclass. The LR and
weight-decay modules give each one a concrete subclass (``CosineDecayLR``,
``CosineDecayWD``, ...); a schedule of another key subclasses these the same way.
"""
import math
import numbers
import warnings
from abc import ABC, abstractmethod

import torch

from cstorch.optim.optimizer import Optimizer

TagsT = str | list[str | None] | None


class Scheduler(ABC):
    """Base class of every schedule. A subclass gives ``param_group_key`` (a property) and
    the formula, `value_at(step)`: the value after `step` calls of `step()`, as torch ops on
    the float32 tensor `step` (no ``.item()``, no Python branching on it: inside a traced
    step it is a traced value). A schedule whose value differs per param group overrides
    `get()` instead.

    ``param_group_tags`` (a tag or a collection of tags) limits the schedule to the param
    groups whose ``"tags"`` entry shares one of them; ``None`` drives every group. It is
    kept as a set (or None). Right after construction each driven group holds the value at
    step ``last_epoch + 1``.
    """

    #: The hyperparameters, by their generic names, in `state_dict()` order.
    _hyper = ()

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: int | None,
                 last_epoch: int = -1, param_group_tags: TagsT = None):
        name = type(self).__name__
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not a cstorch.optim.Optimizer: "
                            f"{name} schedules the param groups of a cstorch.optim optimizer")
        self.optimizer = optimizer
        self.total_iters = total_iters
        self.param_group_tags = _tag_set(param_group_tags)
        self._groups = self._select_groups(self.param_group_tags)
        key = self.param_group_key
        for g in self._groups:
            value = optimizer.param_groups[g].get(key)
            if value is None or isinstance(value, (tuple, list)):
                raise ValueError(f"{name} schedules the param groups' {key!r}, but param group "
                                 f"{g} has {'no such entry' if value is None else repr(value)}; "
                                 f"give the optimizer a number for {key!r}")
        for inner in self._inner():
            missing = [g for g in self._groups if g not in inner._groups]
            if missing:
                raise ValueError(f"{name} drives param groups {missing} that its "
                                 f"{type(inner).__name__} does not; give them the same "
                                 f"param_group_tags")
        prefix = f"{key}_scheduler"
        n = sum(1 for k in optimizer.schedule_state if k.startswith(prefix))
        self._key = f"{prefix}{n}.last_epoch"
        optimizer.schedule_state[self._key] = torch.tensor(float(last_epoch + 1))
        self.update_groups(self._initial_values())
        self.update_last_value()

    def _inner(self):
        """The schedules whose formulas this one uses (they must drive its groups)."""
        return []

    @property
    @abstractmethod
    def param_group_key(self) -> str:
        """The param-group key this schedule writes ("lr", "weight_decay", ...)."""

    def _select_groups(self, tags):
        groups = range(len(self.optimizer.param_groups))
        if tags is None:
            return list(groups)
        chosen = [g for g in groups
                  if (_tag_set(self.optimizer.param_groups[g].get("tags")) or set()) & tags]
        if not chosen:
            raise ValueError(f"no param group of the optimizer has any of the tags {sorted(tags)}")
        return chosen

    # the counter ------------------------------------------------------------------------
    @property
    def _step_tensor(self):
        self.optimizer.state  # noqa: B018  (brings device values to the host when eager)
        return self.optimizer.schedule_state[self._key]

    @property
    def last_epoch(self) -> int:
        """How many times `step()` has run (the step the current value belongs to)."""
        return int(self._step_tensor.item())

    def increment_last_epoch(self):
        """Advance the step counter by one."""
        with torch.no_grad():
            self._step_tensor.add_(1)

    # the schedule -----------------------------------------------------------------------
    @abstractmethod
    def value_at(self, step: torch.Tensor) -> torch.Tensor:
        """The value at `step` (a float32 tensor), as a tensor."""

    def _values_at(self, step):
        """{param group index: value} for the driven groups at `step`."""
        value = self.value_at(step)
        return {g: value for g in self._groups}

    def get(self):
        """The value at the current step: one tensor, or a list with one per driven group
        for a schedule that differs per group."""
        return self.value_at(self._step_tensor)

    def _initial_values(self):
        return self.get()

    def update_groups(self, values):
        """Write `values` (one value for every driven group, or a list with one per group)
        into the driven param groups."""
        if not isinstance(values, (list, tuple)):
            values = [values] * len(self._groups)
        if len(values) != len(self._groups):
            raise ValueError(f"{type(self).__name__} drives {len(self._groups)} param groups, "
                             f"got {len(values)} values")
        key = self.param_group_key
        with torch.no_grad():
            for g, value in zip(self._groups, values):
                group = self.optimizer.param_groups[g]
                value = torch.as_tensor(value, dtype=torch.float32)
                if isinstance(group[key], torch.Tensor):
                    # In place: the tensor is a device-state slot (and a traced value
                    # inside a capture) and must keep its identity.
                    group[key].copy_(value)
                else:
                    group[key] = value.clone()

    def update_last_value(self):  # noqa: B027 (a hook subclasses may fill)
        """Make the values just written the ones `get_last_value()` reports. They are the
        driven groups' own tensors, written in place by `update_groups()` (inside a traced
        step those are the step's state), so there is nothing to copy here."""

    @property
    def _last_value(self):
        return [self.optimizer.param_groups[g][self.param_group_key] for g in self._groups]

    def step(self, *args, **kwargs):
        """Advance the schedule by one step and write the new value into the param groups."""
        self.increment_last_epoch()
        self.update_groups(self.get())
        self.update_last_value()

    def get_last_value(self):
        """The values last written, one per driven param group, as Python floats."""
        self.optimizer.state  # noqa: B018
        return [float(v) for v in self._last_value]

    # checkpoints ------------------------------------------------------------------------
    def _state_name(self, name):
        """The name a hyperparameter has in this class (``initial_val`` is
        ``initial_learning_rate`` in an LR schedule)."""
        attr = getattr(type(self), name, None)
        return getattr(attr, "target", name)

    def _state(self, last_epoch, step_count, last_value, within_step=True):
        state = {self._state_name(n): _plain(getattr(self, n)) for n in self._hyper}
        state["param_group_tags"] = self.param_group_tags
        state["_last_value"] = [torch.as_tensor(v, dtype=torch.float32).detach().clone()
                                for v in last_value]
        state["total_iters"] = self.total_iters
        state["last_epoch"] = torch.tensor(int(last_epoch), dtype=torch.int64)
        state["_step_count"] = step_count
        if within_step:
            state["_get_called_within_step"] = False
        return state

    def _inner_state(self, last_epoch, within_step=True):
        """The state of a schedule used inside another one: its position relative to the
        outer one's, and the values it wrote when made."""
        initial = self._values_at(torch.zeros(()))
        return self._state(last_epoch, 1, [initial[g] for g in self._groups], within_step)

    def state_dict(self):
        """The hyperparameters, the position in the schedule and the values last written,
        under the names the real package uses."""
        epoch = self.last_epoch
        return self._state(epoch, epoch + 1, self._last_value)

    def _load_hyper(self, state_dict):
        for n in self._hyper:
            if self._state_name(n) in state_dict:
                setattr(self, n, state_dict[self._state_name(n)])

    def load_state_dict(self, state_dict):
        """Resume at the saved position: the hyperparameters, the counter and the value
        they imply."""
        self._load_hyper(state_dict)
        with torch.no_grad():
            self._step_tensor.fill_(float(state_dict["last_epoch"]))
        self.update_groups(self.get())
        self.update_last_value()


class _Alias(property):
    """A generic hyperparameter name read and written under a subclass's own name."""

    def __init__(self, target):
        super().__init__(lambda self: getattr(self, target),
                         lambda self, value: setattr(self, target, value),
                         doc=f"The ``{target}`` hyperparameter under its generic name.")
        self.target = target


def alias(target: str) -> property:
    """A property that reads and writes attribute `target`: how an LR schedule names the
    generic ``initial_val`` ``initial_learning_rate`` (and `state_dict()` follows)."""
    return _Alias(target)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _tag_set(tags):
    """``param_group_tags`` (or a group's ``"tags"``) as a set of tags; None stays None."""
    if tags is None:
        return None
    if isinstance(tags, str):
        return {tags}
    try:
        return set(tags)
    except TypeError:
        raise TypeError(f"param group tags must be a string or a collection of strings, "
                        f"got {tags!r}") from None


def _cosine(progress):
    """``(1 + cos(pi * progress)) / 2``."""
    return (1 + torch.cos(math.pi * progress)) / 2


# closed-form schedules --------------------------------------------------------------------
class ConstantScheduler(Scheduler):
    """``val`` at every step (``total_iters`` only bounds it within a sequential schedule)."""
    _hyper = ("val",)

    def __init__(self, optimizer: torch.optim.Optimizer, val: float,
                 total_iters: int | None = None, param_group_tags: TagsT = None):
        self.val = val
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def value_at(self, step):
        return torch.full_like(step, float(self.val))


class PolynomialScheduler(Scheduler):
    """``(initial_val - end_val) * (1 - t / total_iters) ** power + end_val`` up to
    ``total_iters``, then ``end_val``. With ``cycle=True`` the value also holds at
    ``end_val`` after ``total_iters`` (and says so when made): the real package does not
    restart the decay."""
    _hyper = ("initial_val", "end_val", "power", "cycle")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False,
                 param_group_tags: TagsT = None):
        if cycle:
            warnings.warn(f"{type(self).__name__}(cycle=True) holds the end value after "
                          f"total_iters, as the real package does: the decay does not restart",
                          stacklevel=2)
        self.initial_val, self.end_val, self.power, self.cycle = initial_val, end_val, power, cycle
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def value_at(self, step):
        progress = torch.clamp(step, max=float(self.total_iters)) / self.total_iters
        return (self.initial_val - self.end_val) * torch.pow(1 - progress, self.power) + self.end_val


class LinearScheduler(PolynomialScheduler):
    """From ``initial_val`` to ``end_val`` linearly over ``total_iters`` steps, then
    ``end_val`` (``cycle`` as in `PolynomialScheduler`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, cycle: bool = False, param_group_tags: TagsT = None):
        super().__init__(optimizer, initial_val, end_val, total_iters, 1.0, cycle,
                         param_group_tags=param_group_tags)


class ExponentialScheduler(Scheduler):
    """``initial_val * decay_rate ** (t / total_iters)``; with ``staircase`` the exponent is
    floored, so the value drops once every ``total_iters`` steps."""
    _hyper = ("initial_val", "decay_rate", "staircase")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags: TagsT = None):
        self.initial_val, self.decay_rate, self.staircase = initial_val, decay_rate, staircase
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def value_at(self, step):
        exponent = step / self.total_iters
        if self.staircase:
            exponent = torch.floor(exponent)
        return self.initial_val * torch.pow(self.decay_rate, exponent)


class InverseExponentialTimeDecayScheduler(Scheduler):
    """``initial_val / (1 + decay_rate * t ** step_exponent / total_iters)``; with
    ``staircase`` the ratio ``t ** step_exponent / total_iters`` is floored."""
    _hyper = ("initial_val", "step_exponent", "decay_rate", "staircase")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: TagsT = None):
        self.initial_val, self.step_exponent = initial_val, step_exponent
        self.decay_rate, self.staircase = decay_rate, staircase
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def value_at(self, step):
        ratio = torch.pow(step, self.step_exponent) / self.total_iters
        if self.staircase:
            ratio = torch.floor(ratio)
        return self.initial_val / (1 + self.decay_rate * ratio)


class InverseSquareRootDecayScheduler(Scheduler):
    """``initial_val * scale / sqrt(max(t, warmup_steps))``: constant for ``warmup_steps``
    steps, then decaying as ``1 / sqrt(t)``."""
    _hyper = ("initial_val", "scale", "warmup_steps")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float = 1.0,
                 scale: float = 1.0, warmup_steps: int = 1.0, param_group_tags: TagsT = None):
        self.initial_val, self.scale, self.warmup_steps = initial_val, scale, warmup_steps
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def value_at(self, step):
        return self.initial_val * self.scale * torch.rsqrt(
            torch.clamp(step, min=float(self.warmup_steps)))


class CosineDecayScheduler(Scheduler):
    """``end_val + (initial_val - end_val) * (1 + cos(pi * t / total_iters)) / 2`` up to
    ``total_iters``, then ``end_val``."""
    _hyper = ("initial_val", "end_val")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int, param_group_tags: TagsT = None):
        self.initial_val, self.end_val = initial_val, end_val
        super().__init__(optimizer, total_iters, param_group_tags=param_group_tags)

    def value_at(self, step):
        progress = torch.clamp(step, max=float(self.total_iters)) / self.total_iters
        return self.end_val + (self.initial_val - self.end_val) * _cosine(progress)


class CosineAnnealingScheduler(Scheduler):
    """``eta_min + (initial_val - eta_min) * (1 + cos(pi * t / T_max)) / 2`` for every t
    (SGDR's cosine, without restarts): down to ``eta_min`` at ``T_max``, back up to the
    initial value at ``2 * T_max``, and so on."""
    _hyper = ("initial_val", "T_max", "eta_min")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_max: int,
                 eta_min: float = 0.0, param_group_tags: TagsT = None):
        self.initial_val, self.T_max, self.eta_min = initial_val, float(T_max), eta_min
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def value_at(self, step):
        return self.eta_min + (self.initial_val - self.eta_min) * _cosine(step / self.T_max)


class CosineAnnealingWarmRestartsScheduler(Scheduler):
    """SGDR with warm restarts: ``eta_min + (initial_val - eta_min) * (1 + cos(pi * T_cur /
    T_0)) / 2`` where ``T_cur = t mod T_0`` is the number of steps since the last restart,
    so the value falls from the initial value to ``eta_min`` over each period of ``T_0``
    steps and restarts at the initial value (torch's CosineAnnealingWarmRestarts). As in
    the real package, ``T_mult`` (growing periods) must be 1."""
    _hyper = ("initial_val", "T_0", "T_mult", "eta_min")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_0: int,
                 T_mult: int = 1, eta_min: float = 0.0, param_group_tags: TagsT = None):
        if T_mult != 1:
            raise ValueError(f"Unsupported value of Parameters 'T_mult' for LR scheduler type "
                             f"{type(self).__name__}, Only supported default T_mult value: 1.0 "
                             f"(got {T_mult!r}).")
        if not isinstance(T_0, numbers.Integral) or isinstance(T_0, bool) or T_0 <= 0:
            raise ValueError(f"{type(self).__name__} expects T_0, the period in steps, to be a "
                             f"positive integer, got {T_0!r}")
        self.initial_val, self.T_0, self.T_mult, self.eta_min = initial_val, T_0, T_mult, eta_min
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def value_at(self, step):
        since_restart = torch.remainder(step, float(self.T_0))
        return self.eta_min + (self.initial_val - self.eta_min) * _cosine(since_restart / self.T_0)


class StepScheduler(Scheduler):
    """``initial_val * gamma ** floor(t / step_size)``."""
    _hyper = ("initial_val", "gamma", "step_size")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_size: int,
                 gamma: float, param_group_tags: TagsT = None):
        self.initial_val, self.step_size, self.gamma = initial_val, step_size, gamma
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def value_at(self, step):
        return self.initial_val * torch.pow(self.gamma, torch.floor(step / self.step_size))


class MultiStepScheduler(Scheduler):
    """``initial_val * gamma ** (number of milestones <= t)``."""
    _hyper = ("initial_val", "gamma", "milestones")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, gamma: float,
                 milestones: list[int], param_group_tags: TagsT = None):
        self.initial_val, self.gamma, self.milestones = initial_val, gamma, sorted(milestones)
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def value_at(self, step):
        passed = torch.zeros_like(step)
        for m in self.milestones:
            passed = passed + (step >= m).to(step.dtype)
        return self.initial_val * torch.pow(self.gamma, passed)


class MultiplicativeScheduler(Scheduler):
    """``initial_val * coefficient ** t``: the value is multiplied by ``coefficient`` every
    step (the factor `set_value_lambda()` returns)."""
    _hyper = ("initial_val", "coefficient")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, coefficient: float,
                 param_group_tags: TagsT = None):
        self.initial_val, self.coefficient = initial_val, coefficient
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def set_value_lambda(self):
        """The factor applied at every step (a subclass may return another constant)."""
        return self.coefficient

    def value_at(self, step):
        return self.initial_val * torch.pow(self.set_value_lambda(), step)


class LambdaScheduler(Scheduler):
    """``initial_val`` times a function of the step. The function comes from
    `set_value_lambda()`, which a subclass overrides: one function ``f`` gives
    ``initial_val * f(t)``; a list of functions gives the product of ``initial_val * f(t)``
    over them. The default is the real package's: ``[t / 30, 0.95 ** t]``, so the value is
    ``initial_val ** 2 * (t / 30) * 0.95 ** t``. The functions receive the step as a
    float32 tensor and must use torch ops on it (inside a traced step it is a traced
    value). A torch-style ``LambdaLR(optimizer, lr_lambda)`` is refused: the second
    argument is the initial value."""
    _hyper = ("initial_val",)

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float,
                 param_group_tags: TagsT = None):
        if callable(initial_val):
            raise TypeError(f"{type(self).__name__} takes the initial value, not a function "
                            f"of the step: its value is initial_val * f(step) with f from "
                            f"set_value_lambda(), which a subclass overrides (torch's "
                            f"LambdaLR(optimizer, lr_lambda) has no counterpart here)")
        if not isinstance(initial_val, (numbers.Real, torch.Tensor)):
            raise TypeError(f"{type(self).__name__}'s initial value must be a real number, "
                            f"not {type(initial_val).__name__}")
        self.initial_val = initial_val
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def set_value_lambda(self):
        """The function(s) of the step the value follows (see the class)."""
        return [lambda step: step / 30, lambda step: torch.pow(0.95, step)]

    def value_at(self, step):
        fns = self.set_value_lambda()
        if callable(fns):
            return self.initial_val * torch.as_tensor(fns(step), dtype=torch.float32)
        value = torch.ones_like(step)
        for fn in fns:
            value = value * (self.initial_val * torch.as_tensor(fn(step), dtype=torch.float32))
        return value


_CYCLIC_MODES = ("triangular", "triangular2", "exp_range")


class CyclicScheduler(Scheduler):
    """Cyclical values (Smith, 2017) between ``base_val`` and ``max_val``: up over
    ``step_size_up`` steps, down over ``step_size_down`` (default: the same). ``mode``
    scales the amplitude: "triangular" (constant), "triangular2" (halved every cycle),
    "exp_range" (``gamma ** t``); as in torch, the built-in modes fix ``scale_mode``
    ("cycle" for the triangular ones, "iterations" for exp_range). As in the real package,
    an unknown ``mode`` is accepted at construction (with a warning) and refused by the
    first `step()`."""
    _hyper = ("base_val", "max_val", "step_size_up", "step_size_down", "mode", "gamma",
              "scale_mode")

    def __init__(self, optimizer: torch.optim.Optimizer, base_val: float, max_val: float,
                 step_size_up: int = 2000, step_size_down: int = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_mode: str = "cycle", param_group_tags: TagsT = None):
        self.base_val, self.max_val = base_val, max_val
        self.step_size_up = step_size_up
        self.step_size_down = step_size_down if step_size_down is not None else step_size_up
        self.mode, self.gamma = mode, gamma
        if mode in ("triangular", "triangular2"):
            if scale_mode != "cycle":
                warnings.warn(f"{type(self).__name__}: mode {mode!r} scales the amplitude per "
                              f"cycle; scale_mode={scale_mode!r} does not apply (as in torch)",
                              stacklevel=2)
            scale_mode = "cycle"
        elif mode == "exp_range":
            scale_mode = "iterations"
        else:
            warnings.warn(f"{type(self).__name__}: mode {mode!r} is not one of {_CYCLIC_MODES}; "
                          f"the first step() will raise", stacklevel=2)
        self.scale_mode = scale_mode
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def _initial_values(self):
        # The value at a cycle's start is base_val whatever the amplitude's scale, which
        # an unknown mode leaves undefined until the first step.
        if self.mode not in _CYCLIC_MODES:
            return torch.tensor(float(self.base_val))
        return self.get()

    def set_scale_fn(self):
        """The amplitude's scale as a function of the cycle number (triangular modes) or of
        the step (exp_range)."""
        if self.mode == "triangular":
            return lambda x: torch.ones_like(x)
        if self.mode == "triangular2":
            return lambda x: 1 / torch.pow(2.0, x - 1)
        if self.mode == "exp_range":
            return lambda x: torch.pow(self.gamma, x)
        raise ValueError(f"{type(self).__name__}: mode must be one of {_CYCLIC_MODES}, "
                         f"got {self.mode!r}")

    def value_at(self, step):
        scale = self.set_scale_fn()
        total = float(self.step_size_up + self.step_size_down)
        ratio = self.step_size_up / total
        cycle = torch.floor(1 + step / total)
        x = 1 + step / total - cycle
        factor = torch.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        return self.base_val + (self.max_val - self.base_val) * factor * scale(
            cycle if self.scale_mode == "cycle" else step)


_ANNEAL = ("cos", "linear")


class OneCycleScheduler(Scheduler):
    """The 1cycle policy (Smith & Topin, 2018): from ``initial_val`` up to ``max_val`` until
    step ``pct_start * total_steps - 1``, then down to ``initial_val / final_div_factor`` at
    ``total_steps - 1`` (``three_phase``: back down to ``initial_val`` first, until
    ``2 * pct_start * total_steps - 2``). ``anneal_strategy`` is "cos" or "linear". Past
    ``total_steps`` the last phase's curve continues (as in the real package, the linear
    one goes below zero). An unknown ``anneal_strategy`` is accepted at construction (with
    a warning) and refused by the first `step()`, as in the real package."""
    _hyper = ("initial_val", "max_val", "total_steps", "pct_start", "final_div_factor",
              "three_phase", "anneal_strategy")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, max_val: float,
                 total_steps: int = 1000, pct_start: float = 0.3,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 anneal_strategy: str = "cos", param_group_tags: TagsT = None):
        self.initial_val, self.max_val = initial_val, max_val
        self.total_steps, self.pct_start = total_steps, pct_start
        self.final_div_factor, self.three_phase = final_div_factor, three_phase
        self.anneal_strategy = anneal_strategy
        if anneal_strategy not in _ANNEAL:
            warnings.warn(f"{type(self).__name__}: anneal_strategy {anneal_strategy!r} is not "
                          f"one of {_ANNEAL}; the first step() will raise", stacklevel=2)
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def _initial_values(self):
        # Every phase curve starts at its start value, whatever the strategy.
        if self.anneal_strategy not in _ANNEAL:
            return torch.tensor(float(self.initial_val))
        return self.get()

    def _phases(self):
        final = self.initial_val / self.final_div_factor
        up = float(self.pct_start * self.total_steps) - 1
        last = float(self.total_steps - 1)
        if self.three_phase:
            down = float(2 * self.pct_start * self.total_steps) - 2
            return [(up, self.initial_val, self.max_val),
                    (down, self.max_val, self.initial_val),
                    (last, self.initial_val, final)]
        return [(up, self.initial_val, self.max_val), (last, self.max_val, final)]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2 * (1 + torch.cos(math.pi * pct))
        if self.anneal_strategy == "linear":
            return start + (end - start) * pct
        raise ValueError(f"{type(self).__name__}: anneal_strategy must be one of {_ANNEAL}, "
                         f"got {self.anneal_strategy!r}")

    def value_at(self, step):
        value = None
        begin = 0.0
        for end_step, start_val, end_val in self._phases():
            phase = self._anneal(start_val, end_val, (step - begin) / (end_step - begin))
            # A later phase overrides the earlier ones past the earlier phase's end.
            value = phase if value is None else torch.where(step > begin, phase, value)
            begin = end_step
        return value


# schedules of schedules -------------------------------------------------------------------
def _same_optimizer_and_key(name, schedulers, key, optimizer=None):
    """The optimizer all `schedulers` share; they must schedule `key` (errors name `name`)."""
    schedulers = list(schedulers)
    if not schedulers:
        raise ValueError(f"{name} needs at least one scheduler")
    bad = [s for s in schedulers if not isinstance(s, Scheduler)]
    if bad:
        raise TypeError(f"{name} takes cstorch.optim schedulers, got {type(bad[0]).__name__}")
    keys = {s.param_group_key for s in schedulers}
    if keys != {key}:
        raise ValueError(f"{name} schedules {key!r}: its schedulers must all schedule the same "
                         f"param group key, got {sorted(keys)}")
    optimizer = schedulers[0].optimizer if optimizer is None else optimizer
    if any(s.optimizer is not optimizer for s in schedulers):
        raise ValueError(f"{name}'s schedulers must all drive the same optimizer")
    return schedulers, optimizer


class ChainedScheduler(Scheduler):
    """Several schedules at once: the first one's value times each later one's value
    divided by that one's initial value, all at the same step (as the real package
    composes them). The schedulers must drive the same optimizer and key. Only this
    schedule needs stepping: the others supply their formulas."""

    def __init__(self, schedulers: list[Scheduler], param_group_tags: TagsT = None):
        name = type(self).__name__
        self._schedulers, optimizer = _same_optimizer_and_key(
            name, schedulers, self.param_group_key)
        if param_group_tags is None:
            param_group_tags = self._schedulers[0].param_group_tags
        zero = torch.zeros(())
        self._initial = []
        for s in self._schedulers[1:]:
            initial = {g: float(v) for g, v in s._values_at(zero).items()}
            if any(v == 0 for v in initial.values()):
                raise ValueError(f"{name} divides by each later scheduler's initial value, and "
                                 f"{type(s).__name__} starts at 0")
            self._initial.append(initial)
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    @property
    def schedulers(self):
        return self._schedulers

    def _inner(self):
        return self._schedulers

    def _values_at(self, step):
        values = dict(self._schedulers[0]._values_at(step))
        for s, initial in zip(self._schedulers[1:], self._initial):
            later = s._values_at(step)
            values = {g: v * (later[g] / initial[g]) for g, v in values.items() if g in later}
        return values

    def value_at(self, step):
        """The value of the first driven param group at `step` (every group's, unless a
        per-group schedule is inside)."""
        return self._values_at(step)[self._groups[0]]

    def get(self):
        values = self._values_at(self._step_tensor)
        return [values[g] for g in self._groups]

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [s._inner_state(self.last_epoch) for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        for s, inner in zip(self._schedulers, state_dict.get("_schedulers", ())):
            s._load_hyper(inner)
        super().load_state_dict(state_dict)


def _check_milestones(name, schedulers, milestones):
    milestones = list(milestones) if isinstance(milestones, (list, tuple)) else milestones
    if not isinstance(milestones, list) or not all(
            isinstance(m, numbers.Integral) and not isinstance(m, bool) for m in milestones):
        got = [type(m) for m in milestones] if isinstance(milestones, list) else type(milestones)
        raise TypeError(f"Expected milestones to be a list of integers. Got: {got}")
    if len(milestones) != len(schedulers) - 1:
        raise ValueError(f"{name} expects one milestone fewer than schedulers, got "
                         f"{len(schedulers)} schedulers and {len(milestones)} milestones")
    if any(b < a for a, b in zip(milestones, milestones[1:])):
        raise ValueError(f"{name}'s milestones must not decrease, got {milestones}")
    return [int(m) for m in milestones]


class SequentialScheduler(Scheduler):
    """``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its own step
    0, and so on (there is one milestone fewer than schedulers). Only this schedule needs
    stepping: the others supply their formulas."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[Scheduler],
                 milestones: list[int], last_epoch: int = -1, param_group_tags: TagsT = None):
        name = type(self).__name__
        self._milestones = _check_milestones(name, schedulers, milestones)
        self._schedulers, optimizer = _same_optimizer_and_key(
            name, schedulers, self.param_group_key, optimizer)
        if param_group_tags is None:
            param_group_tags = self._schedulers[0].param_group_tags
        super().__init__(optimizer, None, last_epoch, param_group_tags=param_group_tags)

    @property
    def schedulers(self):
        return self._schedulers

    def _inner(self):
        return self._schedulers

    @property
    def milestones(self):
        return self._milestones

    def increment_last_epoch(self, *args, **kwargs):
        """Advance the step counter by one (the inner schedules follow it)."""
        super().increment_last_epoch()

    def _values_at(self, step):
        values = self._schedulers[0]._values_at(step)
        for milestone, s in zip(self._milestones, self._schedulers[1:]):
            later = s._values_at(step - milestone)
            values = {g: torch.where(step >= milestone, later[g], v)
                      for g, v in values.items() if g in later}
        return values

    def value_at(self, step):
        """The value of the first driven param group at `step` (every group's, unless a
        per-group schedule is inside)."""
        return self._values_at(step)[self._groups[0]]

    def get(self):
        values = self._values_at(self._step_tensor)
        return [values[g] for g in self._groups]

    def state_dict(self):
        state = {"_milestones": list(self._milestones)}
        state.update(super().state_dict())
        epoch = self.last_epoch
        starts = [0] + self._milestones
        state["_schedulers"] = [s._inner_state(epoch - start)
                                for s, start in zip(self._schedulers, starts)]
        return state

    def load_state_dict(self, state_dict):
        if "_milestones" in state_dict:
            self._milestones = list(state_dict["_milestones"])
        for s, inner in zip(self._schedulers, state_dict.get("_schedulers", ())):
            s._load_hyper(inner)
        super().load_state_dict(state_dict)


class PiecewiseConstantScheduler(SequentialScheduler):
    """``vals[i]`` where i is the number of ``milestones`` reached (``t >= m``); there is
    one more value than milestones. A `SequentialScheduler` of ``constant_cls`` schedules,
    one per value."""

    def __init__(self, optimizer: torch.optim.Optimizer, constant_cls: type, vals: list[float],
                 milestones: list[int], param_group_tags: TagsT = None):
        name = type(self).__name__
        vals, milestones = list(vals), list(milestones)
        if len(vals) != len(milestones) + 1:
            raise ValueError(f"{name} needs exactly one more value than milestones, got "
                             f"{len(vals)} values and {len(milestones)} milestones")
        _check_milestones(name, vals, milestones)
        spans = [b - a for a, b in zip([0] + milestones, milestones)] + [None]
        schedulers = [constant_cls(optimizer, v, total_iters=span,
                                   param_group_tags=param_group_tags)
                      for v, span in zip(vals, spans)]
        super().__init__(optimizer, schedulers, milestones, param_group_tags=param_group_tags)


class ScalePerParamScheduler(Scheduler):
    """``scheduler``'s value times each param group's adjustment factor, read from the
    group when this schedule is made (the group's ``adjust_val`` entry here,
    ``adjust_learning_rate`` for the LR schedule; 1 where a group has none), as muP's
    per-layer multipliers need. Only this schedule needs stepping: the wrapped one
    supplies its formula."""
    _hyper = ("adjustment_scalars",)
    #: The param-group entry holding a group's factor.
    _adjust_key = "adjust_val"

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Scheduler,
                 param_group_tags: TagsT = None):
        name = type(self).__name__
        if not isinstance(scheduler, Scheduler) or \
                scheduler.param_group_key != self.param_group_key:
            raise TypeError(f"{name} wraps a scheduler of the param groups' "
                            f"{self.param_group_key!r}, got {type(scheduler).__name__}")
        if scheduler.optimizer is not optimizer:
            raise ValueError(f"{name}'s scheduler must drive the same optimizer")
        if param_group_tags is None:
            param_group_tags = scheduler.param_group_tags
        self._scheduler = scheduler
        groups = optimizer.param_groups
        self.adjustment_scalars = [float(g.get(self._adjust_key, 1.0)) for g in groups]
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    @property
    def scheduler(self):
        return self._scheduler

    def _inner(self):
        return [self._scheduler]

    def increment_last_epoch(self, *args, **kwargs):
        """Advance the step counter by one (the wrapped schedule follows it)."""
        super().increment_last_epoch()

    def _values_at(self, step):
        inner = self._scheduler._values_at(step)
        return {g: inner[g] * self.adjustment_scalars[g] for g in self._groups}

    def value_at(self, step):
        """The value of the first driven param group at `step` (every group's, unless a
        per-group schedule is inside)."""
        return self._values_at(step)[self._groups[0]]

    def get(self):
        values = self._values_at(self._step_tensor)
        return [values[g] for g in self._groups]

    def state_dict(self):
        state = super().state_dict()
        state["_scheduler"] = self._scheduler._inner_state(self.last_epoch, within_step=False)
        return state

    def load_state_dict(self, state_dict):
        if "_scheduler" in state_dict:
            self._scheduler._load_hyper(state_dict["_scheduler"])
        super().load_state_dict(state_dict)


__all__ = ["Scheduler", "ConstantScheduler", "PolynomialScheduler", "LinearScheduler",
           "ExponentialScheduler", "InverseExponentialTimeDecayScheduler",
           "InverseSquareRootDecayScheduler", "CosineDecayScheduler", "CosineAnnealingScheduler",
           "CosineAnnealingWarmRestartsScheduler", "StepScheduler", "MultiStepScheduler",
           "MultiplicativeScheduler", "LambdaScheduler", "CyclicScheduler", "OneCycleScheduler",
           "ChainedScheduler", "SequentialScheduler", "PiecewiseConstantScheduler",
           "ScalePerParamScheduler"]
