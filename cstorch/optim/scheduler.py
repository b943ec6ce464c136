"""`cerebras.pytorch.optim.scheduler`: schedules of one optimizer param-group value.

A `Scheduler` drives one key of the optimizer's param groups (``param_group_key``: "lr"
for `cstorch.optim.lr_scheduler`, "weight_decay" for `cstorch.optim.weight_decay_scheduler`)
as a closed-form function of a step counter. The counter is a tensor kept in the
optimizer's ``schedule_state`` (device state, bound into a traced step like the optimizer's
own state) and the value is written as a tensor into each param group the schedule drives,
so `scheduler.step()` inside `@cstorch.trace` advances the schedule on the device without a
new capture, and eagerly it does the same with ordinary tensors: both run the same torch
ops, so traced and eager values agree step by step.

The generic schedules here (`ChainedScheduler`, `SequentialScheduler`,
`PiecewiseConstantScheduler`) take the key from their sub-schedulers or from
``param_group_key=``; the LR and weight-decay modules give each a subclass with that key
fixed.
"""
from typing import List, Optional

import torch


class Scheduler:
    """Base class: subclasses set ``param_group_key`` (or pass ``param_group_key=``) and
    implement `value_at(step)`, the value after `step` calls of `step()`, as torch ops on
    the float32 tensor `step` (no ``.item()``, no Python branching on it: inside a traced
    step it is a traced value). A schedule whose value differs per param group overrides
    `values_at(step)` instead.

    ``param_group_tags`` (a tag or a collection of tags) limits the schedule to the param
    groups whose ``"tags"`` entry shares one of them; ``None`` drives every group. It is
    kept as a set (or None). Right after construction each driven group's value is the
    value at step 0.
    """

    #: The param-group key this schedule writes ("lr", "weight_decay", ...).
    param_group_key: Optional[str] = None
    #: The name of the initial values in `state_dict()`.
    _base_name = "base_values"

    def __init__(self, optimizer, total_iters=None, last_epoch=-1, param_group_tags=None,
                 param_group_key=None):
        from cstorch.optim.optimizer import Optimizer
        if param_group_key is not None:
            self.param_group_key = param_group_key
        name = type(self).__name__
        if not isinstance(self.param_group_key, str) or not self.param_group_key:
            raise TypeError(f"{name} does not say which param-group value it schedules: pass "
                            "param_group_key= (a param group key such as 'lr'), or use a "
                            "subclass that sets it (cstorch.optim.lr_scheduler for 'lr', "
                            "cstorch.optim.weight_decay_scheduler for 'weight_decay')")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{name} needs a cstorch.optim optimizer, "
                            f"got {type(optimizer).__name__}")
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
        self.base_values = [float(optimizer.param_groups[g][key]) for g in self._groups]
        prefix = f"{key}_scheduler"
        n = sum(1 for k in optimizer.schedule_state if k.startswith(prefix))
        self._key = f"{prefix}{n}.last_epoch"
        optimizer.schedule_state[self._key] = torch.tensor(float(last_epoch + 1))
        self._write()

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

    # the schedule -----------------------------------------------------------------------
    def value_at(self, step: torch.Tensor) -> torch.Tensor:
        """The value at `step` (a float32 tensor), as a tensor."""
        raise NotImplementedError(f"{type(self).__name__} does not implement value_at(step)")

    def values_at(self, step):
        """One value per driven param group; the same for all unless a schedule scales
        each group's own base value."""
        value = self.value_at(step)
        return [value] * len(self._groups)

    def _write(self):
        step = self._step_tensor
        key = self.param_group_key
        with torch.no_grad():
            for g, value in zip(self._groups, self.values_at(step)):
                group = self.optimizer.param_groups[g]
                value = torch.as_tensor(value, dtype=torch.float32)
                if isinstance(group[key], torch.Tensor):
                    # In place: the tensor is a device-state slot (and a traced value
                    # inside a capture) and must keep its identity.
                    group[key].copy_(value)
                else:
                    group[key] = value.clone()

    def step(self, *args, **kwargs):
        """Advance the schedule by one step and write the new value into the param groups."""
        with torch.no_grad():
            self._step_tensor.add_(1)
        self._write()

    def get_last_value(self):
        """The values last written, one per driven param group, as Python floats."""
        self.optimizer.state  # noqa: B018
        return [float(self.optimizer.param_groups[g][self.param_group_key])
                for g in self._groups]

    # checkpoints ------------------------------------------------------------------------
    def state_dict(self):
        """The position in the schedule (and the initial values); hyperparameters come from
        the constructor, as with torch's schedulers."""
        return {"last_epoch": self.last_epoch, self._base_name: list(self.base_values)}

    def load_state_dict(self, state_dict):
        """Resume at the saved position: the counter and the value it implies."""
        self.base_values = list(state_dict.get(self._base_name, self.base_values))
        with torch.no_grad():
            self._step_tensor.fill_(float(state_dict["last_epoch"]))
        self._write()


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


def _same_optimizer_and_key(name, schedulers, optimizer=None):
    """The optimizer and key all `schedulers` share (errors name `name`)."""
    schedulers = list(schedulers)
    if not schedulers:
        raise ValueError(f"{name} needs at least one scheduler")
    bad = [s for s in schedulers if not isinstance(s, Scheduler)]
    if bad:
        raise TypeError(f"{name} takes cstorch.optim schedulers, got {type(bad[0]).__name__}")
    optimizer = schedulers[0].optimizer if optimizer is None else optimizer
    if any(s.optimizer is not optimizer for s in schedulers):
        raise ValueError(f"{name}'s schedulers must all drive the same optimizer")
    keys = {s.param_group_key for s in schedulers}
    if len(keys) != 1:
        raise ValueError(f"{name}'s schedulers must all schedule the same param group key, "
                         f"got {sorted(keys)}")
    return schedulers, optimizer, keys.pop()


class ChainedScheduler(Scheduler):
    """The product of its schedulers' values at the same step (all must drive the same
    optimizer and key). Give one schedule the absolute value and the others an initial
    value of 1.0 to use them as factors, as chaining torch's multiplicative schedules
    does."""

    def __init__(self, schedulers: List[Scheduler], param_group_tags=None):
        schedulers, optimizer, key = _same_optimizer_and_key(type(self).__name__, schedulers)
        self.schedulers = schedulers
        super().__init__(optimizer, None, param_group_tags=param_group_tags,
                         param_group_key=key)

    def values_at(self, step):
        values = self.schedulers[0].values_at(step)
        for scheduler in self.schedulers[1:]:
            values = [a * b for a, b in zip(values, scheduler.values_at(step))]
        return values


class SequentialScheduler(Scheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` from its step
    0, and so on. The sub-schedulers only supply their formulas; this scheduler's own
    counter drives them. Without ``milestones`` they are the running sums of the
    sub-schedulers' ``total_iters`` (all but the last must have one)."""

    def __init__(self, optimizer, schedulers: List[Scheduler], milestones=None, last_epoch=-1,
                 param_group_tags=None):
        name = type(self).__name__
        schedulers, optimizer, key = _same_optimizer_and_key(name, schedulers, optimizer)
        if milestones is None:
            spans = [s.total_iters for s in schedulers[:-1]]
            if any(span is None for span in spans):
                raise ValueError(f"{name} without milestones needs total_iters on every "
                                 "scheduler but the last")
            milestones = [sum(spans[:i + 1]) for i in range(len(spans))]
        milestones = list(milestones)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"{name} expects one milestone fewer than schedulers, got "
                             f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        if any(b < a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"{name}'s milestones must not decrease, got {milestones}")
        self.schedulers = schedulers
        self.milestones = milestones
        super().__init__(optimizer, None, last_epoch, param_group_tags=param_group_tags,
                         param_group_key=key)

    def values_at(self, step):
        values = self.schedulers[0].values_at(step)
        for milestone, scheduler in zip(self.milestones, self.schedulers[1:]):
            later = scheduler.values_at(step - milestone)
            values = [torch.where(step >= milestone, b, a) for a, b in zip(values, later)]
        return values


class PiecewiseConstantScheduler(SequentialScheduler):
    """``values[i]`` where i is the number of ``milestones`` reached (``t >= m``); there is
    one more value than milestones. A special case of `SequentialScheduler` (as in the
    real package), built from its values directly."""

    def __init__(self, optimizer, values, milestones, param_group_tags=None,
                 param_group_key=None):
        name = type(self).__name__
        values, milestones = list(values), list(milestones)
        if len(values) != len(milestones) + 1:
            raise ValueError(f"{name} needs exactly one more value than milestones, got "
                             f"{len(values)} values and {len(milestones)} milestones")
        if any(b < a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"{name}'s milestones must not decrease, got {milestones}")
        self.values = values
        self.milestones = milestones
        self.schedulers = []
        Scheduler.__init__(self, optimizer, None, param_group_tags=param_group_tags,
                           param_group_key=param_group_key)

    def value_at(self, step):
        value = torch.full_like(step, float(self.values[0]))
        for m, v in zip(self.milestones, self.values[1:]):
            value = torch.where(step >= m, torch.full_like(step, float(v)), value)
        return value

    def values_at(self, step):
        return Scheduler.values_at(self, step)
