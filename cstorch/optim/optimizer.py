"""`cstorch.optim.Optimizer`: the base of every cstorch optimizer.

Its state exists before the first step (each optimizer creates it in `preinitialize`), so
a traced step sees optimizer state as inputs like any other state and returns it updated.
Once the optimizer is created, its state tensors, its tensor-valued param-group entries
and its schedules' counters are state of the run (`cstorch.state`): device tensors that
every read and write reaches.
"""
import contextlib
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict

import torch
from torch.optim.optimizer import ParamsT  # noqa: F401  (the params type, re-exported)
from torch.utils.hooks import RemovableHandle

from bridge.device_tensor import DeviceTensor
from wafer.host_memory import own_mappings
from cstorch.backend import current_or_cpu_backend


class Optimizer(torch.optim.Optimizer, ABC):
    """Base class of cstorch optimizers.

    Subclasses call ``super().__init__(params, defaults)``, create every state tensor in
    `preinitialize` (zeros with `torch.zeros_like`, say) and implement `step` with
    ordinary torch ops, which run eagerly or inside a traced step alike. In a traced step,
    nonzero float hyperparameters (lr, momentum, each of the betas, ...) are 0-d tensors,
    so that changing them between steps reuses the compiled program.

    With ``enable_global_step=True`` each parameter's state also holds a float32 ``step``
    (after what `preinitialize` created), which `increment_global_step` advances.
    """

    def __init__(self, params, defaults, enable_global_step=False):
        super().__init__(params, defaults)
        # Tensors that schedules of this optimizer keep (an LR scheduler's step counter):
        # device state like the optimizer's own, but outside its state_dict.
        self.schedule_state = _Notifying(self)
        self._zero_grad_pre_hooks = OrderedDict()
        self._zero_grad_post_hooks = OrderedDict()
        self.enable_global_step = enable_global_step
        # The state is made on the host and moved to the device: its host copies in
        # mappings of their own leave no freed space behind (`wafer.host_memory`).
        with own_mappings():
            with torch.no_grad():
                self.preinitialize()
            self._add_global_steps()
            self._backend = current_or_cpu_backend()
            position = self._backend.optimizers.append(self)
            self._prefix = "optimizer" if position == 0 else f"optimizer{position}"
            self._backend.state.refresh(initial=True)

    def _add_global_steps(self):
        """With `enable_global_step`, each parameter's state ends with its ``step``
        counter (after what `preinitialize` created, as the real package orders it)."""
        if not self.enable_global_step:
            return
        for group in self.param_groups:
            for p in group["params"]:
                if "step" not in self.state[p]:
                    self.state[p]["step"] = torch.tensor(0.0)

    def apply(self, f):
        """Call ``f(self)``: how a sparsity algorithm takes hold of the optimizer
        (``optimizer.apply(sparsity)``, as ``model.apply(sparsity)`` does for the model)."""
        f(self)

    def increment_global_step(self, p) -> torch.Tensor:
        """Advance parameter `p`'s global step by one and return it: a float32 tensor in
        the optimizer state (`enable_global_step=True`), so a traced step advances it
        without re-capture."""
        step = self.state[p].get("step") if p in self.state else None
        if step is None:
            raise RuntimeError("this optimizer keeps no global step for the parameter; "
                               "construct it with enable_global_step=True")
        step.add_(1.0)
        return step

    def visit_state(self, fn):
        """Call ``fn(value)`` on each value of the per-parameter state; a value that `fn`
        returns (not None) replaces the one it was given."""
        replaced = False
        for state in self.state.values():
            for key, value in list(state.items()):
                new = fn(value)
                if new is not None and new is not value:
                    state[key] = new
                    replaced = True
        backend = self.__dict__.get("_backend")
        if replaced and backend is not None:
            backend.state.dirty = True

    def register_zero_grad_pre_hook(self, hook) -> RemovableHandle:
        """Register ``hook(optimizer, args, kwargs)``, called before each `zero_grad`. It
        may return new ``(args, kwargs)`` for `zero_grad`. Returns a handle whose
        ``remove()`` unregisters it."""
        handle = RemovableHandle(self._zero_grad_pre_hooks)
        self._zero_grad_pre_hooks[handle.id] = hook
        return handle

    def register_zero_grad_post_hook(self, hook) -> RemovableHandle:
        """Register ``hook(optimizer, args, kwargs)``, called after each `zero_grad`.
        Returns a handle whose ``remove()`` unregisters it."""
        handle = RemovableHandle(self._zero_grad_post_hooks)
        self._zero_grad_post_hooks[handle.id] = hook
        return handle

    def zero_grad(self, *args, **kwargs):
        """Reset the gradients (arguments as `torch.optim.Optimizer.zero_grad`'s), with the
        registered zero_grad pre and post hooks around it."""
        for hook in list(self.__dict__.get("_zero_grad_pre_hooks", {}).values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"a zero_grad pre hook must return None or (args, kwargs), "
                                       f"got {result!r}")
                args, kwargs = result
        super().zero_grad(*args, **kwargs)
        for hook in list(self.__dict__.get("_zero_grad_post_hooks", {}).values()):
            hook(self, args, kwargs)

    def state_dict(self, *args, **kwargs):
        """The optimizer's state and param groups (arguments as
        `torch.optim.Optimizer.state_dict`'s)."""
        return super().state_dict(*args, **kwargs)

    @abstractmethod
    def preinitialize(self):
        """Create all optimizer state, before any step runs."""

    @abstractmethod
    def step(self, closure=None):
        """Update the parameters from their gradients."""

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    # the state protocol ------------------------------------------------------------
    def state_entries(self, replaced: dict):
        """(name, table, key, tensor) of every tensor this optimizer holds, named as in
        its state_dict. Parameters that the run replaced by device tensors (at compile or
        adoption) are replaced here too, the per-parameter state re-keyed with them.
        Parameters on the host (an optimizer used eagerly, outside any compiled module)
        and their state are left alone: `on_device` tells whether a traced step may use it."""
        rekey = {}
        for g, group in enumerate(self.param_groups):
            if type(group) is not ParamGroup:
                self.param_groups[g] = group = ParamGroup(group)
                _group_writes[0] += 1
            for i, p in enumerate(group["params"]):
                new = replaced.get(id(p))
                if new is not None and new is not p:
                    group["params"][i] = new
                    rekey[p] = new
        if rekey:
            self.state = defaultdict(dict, {rekey.get(p, p): v for p, v in self.state.items()})
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if isinstance(p, DeviceTensor):
                    yield f"{self._prefix}.param_groups.{g}.params.{i}", group["params"], i, p
            for key, value in group.items():
                if key != "params" and isinstance(value, torch.Tensor):
                    yield f"{self._prefix}.param_groups.{g}.{key}", group, key, value
        for index, p in enumerate(self._params()):
            if not isinstance(p, DeviceTensor):
                continue
            for key, value in self.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    yield f"{self._prefix}.state.{index}.{key}", self.state[p], key, value
        for key, value in self.schedule_state.items():
            yield f"{self._prefix}.{key}", self.schedule_state, key, value

    @property
    def on_device(self) -> bool:
        """Whether every parameter is state of a compiled module (a traced step can use it)."""
        return all(isinstance(p, DeviceTensor) for p in self._params())

    def hyperparameters(self):
        """(group index, group, key, index, value) of every float hyperparameter: inputs
        of a traced step, not constants of its program. `index` is the position in a tuple
        value (None for a float)."""
        for g, group in enumerate(self.param_groups):
            for key, value in group.items():
                if type(value) is float:
                    yield g, group, key, None, value
                elif type(value) is tuple:
                    for i, v in enumerate(value):
                        if type(v) is float:
                            yield g, group, key, i, v

    @contextlib.contextmanager
    def keyed_by(self, params: dict):
        """Key the per-parameter state by other tensors (a capture's traced parameters)."""
        saved = self.state
        self.state = defaultdict(dict, {params.get(id(p), p): v for p, v in saved.items()})
        try:
            yield
        finally:
            self.state = saved

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch builds new state tensors on load: they become the run's state.
        self._backend.state.refresh()

    def add_param_group(self, param_group):
        """Add a param group; its state is created at once, like the state of the groups
        given at construction (`preinitialize` leaves parameters that have state alone)."""
        super().add_param_group(param_group)
        backend = self.__dict__.get("_backend")
        if backend is not None:
            with torch.no_grad():
                self.preinitialize()
            self._add_global_steps()
            backend.state.dirty = True


def hyperparameters(optimizers):
    """(where, group, key, tuple index, value) of every float hyperparameter of
    `optimizers` (a backend's `WeakRegistry`), in order; `where` is (optimizer position,
    group index), positions staying as they were when an optimizer is dropped."""
    for o, opt in optimizers.items():
        for g, group, key, index, value in opt.hyperparameters():
            yield (o, g), group, key, index, value


_group_writes = [0]


def group_writes() -> int:
    """How many writes param groups have seen: what programs depend on in them needs
    looking at again only when this changed."""
    return _group_writes[0]


class ParamGroup(dict):
    """A param group that counts the writes to it (a scheduler setting ``lr``, ...)."""

    def __setitem__(self, key, value):
        _group_writes[0] += 1
        super().__setitem__(key, value)

    def __delitem__(self, key):
        _group_writes[0] += 1
        super().__delitem__(key)

    def update(self, *args, **kwargs):
        _group_writes[0] += 1
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        _group_writes[0] += 1
        return super().setdefault(key, default)

    def pop(self, *args):
        _group_writes[0] += 1
        return super().pop(*args)

    def clear(self):
        _group_writes[0] += 1
        super().clear()

    def __reduce_ex__(self, protocol):
        return dict, (dict(self),)


class _Notifying(dict):
    """`schedule_state`: a new counter becomes run state before the next step."""

    def __init__(self, optimizer):
        super().__init__()
        # Weakly: the run's state holds this table, and must not keep the optimizer alive.
        self.optimizer = weakref.ref(optimizer)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        optimizer = self.optimizer()
        backend = optimizer.__dict__.get("_backend") if optimizer is not None else None
        if backend is not None:
            backend.state.dirty = True
