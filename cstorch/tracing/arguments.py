"""The split of a step's arguments and results into tensors and everything else.

Tensors are the program's inputs and outputs; everything else is part of what the program
depends on, keyed by value: numbers and strings as they are, containers by their
contents, modules and other objects by their state (`fingerprint`), never by `id()`.
"""
import functools
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from cstorch.compile import CompiledModule
from cstorch.optim.optimizer import Optimizer
from cstorch.state import TrackedTable

_PLAIN = (int, float, str, bool, type(None), torch.dtype, torch.device, torch.Size)
_SKIPPED_ATTRS = {"_parameters", "_buffers", "_modules", "_backward_hooks", "_backward_pre_hooks",
                  "_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                  "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
                  "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                  "_load_state_dict_post_hooks", "_non_persistent_buffers_set", "training",
                  "_is_full_backward_hook"}


def fingerprint(value, depth: int = 0):
    """A hashable key that equals for objects a captured program treats the same."""
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(fingerprint(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((k, fingerprint(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return (type(value), frozenset(fingerprint(v, depth + 1) for v in value))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, types.MethodType):  # the function and the object it is bound to
        return ("method", fingerprint(value.__func__, depth + 1), fingerprint(value.__self__, depth + 1))
    if isinstance(value, functools.partial):
        return ("partial", fingerprint(value.func, depth + 1), fingerprint(value.args, depth + 1),
                fingerprint(value.keywords, depth + 1))
    if isinstance(value, types.FunctionType):  # its code and what it closes over
        cells = tuple(fingerprint(c.cell_contents, depth + 1) for c in (value.__closure__ or ())
                      if _cell_filled(c))
        return ("fn", value.__code__, cells)
    if isinstance(value, type) or _is_run_object(value) or depth > 4:
        # classes; the run's own objects (keyed through the run's state); deep nesting
        return ("id", id(value))
    attrs = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:   # values in __slots__ too, not only __dict__
        for slot in getattr(cls, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                attrs[slot] = getattr(value, slot)
    if not attrs:
        return ("id", id(value))   # builtins and opaque objects: nothing to compare by
    items = tuple(sorted((k, fingerprint(v, depth + 1)) for k, v in attrs.items()
                         if k not in _SKIPPED_ATTRS and not k.startswith("__")))
    if isinstance(value, torch.nn.Module):
        items += (("modules", tuple((k, fingerprint(m, depth + 1))
                                    for k, m in value._modules.items())),)
    return (type(value), items)


def _cell_filled(cell):
    try:
        cell.cell_contents  # noqa: B018 (reading an empty cell raises)
        return True
    except ValueError:
        return False


def _is_run_object(value):
    return isinstance(value, (CompiledModule, Optimizer)) or (
        isinstance(value, torch.nn.Module) and _is_compiled(value))


def _is_compiled(module):
    return isinstance(module.__dict__.get("_parameters"), TrackedTable)


@dataclass(slots=True)
class Call:
    """One call's arguments: the tensors in flattening order, and the rest."""
    spec: Any
    leaves: list               # every leaf; tensors included
    positions: list            # indices of the tensor leaves
    key: Any                   # what the program depends on, besides tensor values

    @property
    def tensors(self):
        if isinstance(self.spec, tuple):
            return self.leaves
        return [self.leaves[i] for i in self.positions]

    def rebuild(self, tensors):
        """(args, kwargs) with `tensors` in place of the call's tensors."""
        if isinstance(self.spec, tuple):
            return tuple(tensors), {}
        leaves = list(self.leaves)
        for pos, t in zip(self.positions, tensors):
            leaves[pos] = t
        return pytree.tree_unflatten(leaves, self.spec)


def split_call(args, kwargs) -> Call:
    if not kwargs and all([type(a) is torch.Tensor for a in args]):
        # The common call, flattened without the generic tree walk.
        spec = ("flat", len(args))
        return Call(spec, args, range(len(args)), (spec, tuple([(a.shape, a.dtype) for a in args])))
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    key = (spec, tuple(("T", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor)
                       else fingerprint(v) for v in leaves))
    return Call(spec, leaves, positions, key)


@dataclass
class Results:
    """Where a step's returned tensors go in its returned structure."""
    spec: Any
    leaves: list               # non-tensor leaves; tensors as None
    positions: list

    @classmethod
    def of(cls, result):
        leaves, spec = pytree.tree_flatten(result)
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        kept = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        return cls(spec, kept, positions), [leaves[i] for i in positions]

    def rebuild(self, tensors):
        """The returned structure with `tensors` (the step's outputs, results first)."""
        if self.spec.is_leaf():  # a step that returns one tensor (or one value)
            return tensors[0] if self.positions else self.leaves[0]
        leaves = list(self.leaves)
        for pos, t in zip(self.positions, tensors):
            leaves[pos] = t
        return pytree.tree_unflatten(leaves, self.spec)
