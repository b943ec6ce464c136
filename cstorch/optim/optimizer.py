"""`cstorch.optim.Optimizer`: the base of every cstorch optimizer.

Its state exists before the first step (each optimizer creates it in `preinitialize`), so
a traced step sees optimizer state as inputs like any other state and returns it updated.
"""
from abc import ABC, abstractmethod
from collections import defaultdict

import torch

from cstorch.backend import current_backend_impl


class Optimizer(torch.optim.Optimizer, ABC):
    """Base class of cstorch optimizers.

    Subclasses call ``super().__init__(params, defaults)``, create every state tensor in
    `preinitialize` (zeros with `torch.zeros_like`, say) and implement `step` with
    ordinary torch ops, which run eagerly or inside a traced step alike.
    """

    def __init__(self, params, defaults, enable_global_step: bool = False):
        super().__init__(params, defaults)
        # Tensors that schedules of this optimizer keep (an LR scheduler's step counter):
        # device state like the optimizer's own, but outside its state_dict.
        self.schedule_state = {}
        self.enable_global_step = enable_global_step
        if enable_global_step:
            for group in self.param_groups:
                group["step"] = torch.tensor(0.0)
        with torch.no_grad():
            self.preinitialize()
        self._bound = None
        self._backend = current_backend_impl(create=True)
        self._backend.optimizers.append(self)
        self._prefix = ("optimizer" if len(self._backend.optimizers) == 1
                        else f"optimizer{len(self._backend.optimizers) - 1}")

    def increment_global_step(self, group) -> torch.Tensor:
        """Advance and return the param group's step counter (`enable_global_step=True`):
        a tensor in the state, so a traced step advances it without re-capture."""
        if "step" not in group:
            raise RuntimeError("this optimizer keeps no global step; construct it with "
                               "enable_global_step=True")
        group["step"].add_(1)
        return group["step"]

    @abstractmethod
    def preinitialize(self):
        """Create all optimizer state, before any step runs."""

    @abstractmethod
    def step(self, closure=None):
        """Update the parameters from their gradients."""

    @staticmethod
    def registered(backend):
        return list(backend.optimizers)

    # the state, kept current with the device ---------------------------------------
    def _current(self, name):
        """`name` from __dict__, after device values are copied back (outside a capture)."""
        backend = self.__dict__.get("_backend")
        if backend is not None and self.__dict__.get("_bound") is None:
            backend.state.sync_to_host()
        return self.__dict__[name]

    # Groups hold device state too (a scheduled lr tensor, the global step).
    state = property(lambda self: self._current("_state"),
                     lambda self, value: self.__dict__.__setitem__("_state", value))
    param_groups = property(lambda self: self._current("_param_groups"),
                            lambda self, value: self.__dict__.__setitem__("_param_groups", value))

    @property
    def raw_param_groups(self):
        """The param groups without bringing their tensors up to date (no host copy)."""
        return self.__dict__["_param_groups"]

    def __setstate__(self, state):
        # torch writes `state` straight into __dict__ on load; keep it behind the property.
        state = dict(state)
        if "state" in state:
            self.__dict__["_state"] = state.pop("state")
        if "param_groups" in state:
            self.__dict__["_param_groups"] = state.pop("param_groups")
        super().__setstate__(state)

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def _state_locations(self):
        """(slot name, location, tensor) of every state tensor, in state_dict order."""
        for i, p in enumerate(self._params()):
            for key, value in self.__dict__["_state"].get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    yield f"{self._prefix}.state.{i}.{key}", ("optimizer", id(self), i, key), value
        for g, group in enumerate(self.param_groups):
            for key, value in group.items():
                if key != "params" and isinstance(value, torch.Tensor):
                    yield (f"{self._prefix}.param_groups.{g}.{key}", ("optimizer-group", id(self), g, key),
                           value)
        for key, value in self.__dict__.get("schedule_state", {}).items():
            yield f"{self._prefix}.{key}", ("optimizer-schedule", id(self), key), value

    def register_state(self, device_state):
        """Make every state tensor a slot of the device state (again, after a load)."""
        for p in self._params():
            if device_state.index_of(p) is None:
                raise RuntimeError(
                    "the optimizer holds a parameter that belongs to no compiled module; "
                    "call cstorch.compile(model) before creating the optimizer for its parameters")
        for name, location, tensor in self._state_locations():
            device_state.bind_location(name, location, tensor)

    def bind(self, device_state, traced):
        params = self._params()
        self._bound = ([list(g["params"]) for g in self.param_groups], self.__dict__["_state"],
                       [dict(g) for g in self.param_groups], dict(self.schedule_state))
        swap = {id(p): traced[device_state.index_of(p)] for p in params}
        new_state = defaultdict(dict)
        for p in params:
            for key, value in self.__dict__["_state"].get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    value = traced[device_state.index_of(value)]
                new_state[swap[id(p)]][key] = value
        for group in self.param_groups:
            group["params"] = [swap[id(p)] for p in group["params"]]
            for key, value in list(group.items()):
                if key != "params" and isinstance(value, torch.Tensor):
                    group[key] = traced[device_state.index_of(value)]
        self.__dict__["_state"] = new_state
        for key, value in list(self.schedule_state.items()):
            self.schedule_state[key] = traced[device_state.index_of(value)]
        self._slot_of = {loc: device_state.slot_of_location(loc) for _, loc, _ in
                         self._original_locations(device_state)}

    def _original_locations(self, device_state):
        saved_groups, saved_state, saved_group_values, saved_schedule = self._bound
        for key, value in saved_schedule.items():
            yield None, ("optimizer-schedule", id(self), key), value
        for i, p in enumerate(p for ps in saved_groups for p in ps):
            for key, value in saved_state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    yield None, ("optimizer", id(self), i, key), value
        for g, group in enumerate(saved_group_values):
            for key, value in group.items():
                if key != "params" and isinstance(value, torch.Tensor):
                    yield None, ("optimizer-group", id(self), g, key), value

    def collect(self, device_state, values):
        """Write the traced step's final state tensors into `values`, by slot."""
        for _, location, tensor in self._state_locations():
            values[self._slot_of[location]] = tensor

    def unbind(self):
        saved_groups, saved_state, saved_group_values, saved_schedule = self._bound
        self.schedule_state.clear()
        self.schedule_state.update(saved_schedule)
        for group, params, values in zip(self.param_groups, saved_groups, saved_group_values):
            group.clear()
            group.update(values)
            group["params"] = params
        self.__dict__["_state"] = saved_state
        self._bound = None

    def state_dict(self, *args, **kwargs):
        self.state  # noqa: B018  (brings the state up to date)
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict):
        self.state  # noqa: B018
        super().load_state_dict(state_dict)
        self.register_state(self._backend.state)
