"""Recipes: how a lazy tensor's value is made, as a graph of nodes that hold no data."""
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from bridge import to_jax_dtype, to_torch_dtype
from bridge.device_tensor import Absent, DeviceTensor
from cstorch.storage.lazy import LazyTensor

aten = torch.ops.aten


class Node:
    """One value of a recipe, never its data. Immutable: a write makes a new node.

    kind "const": `value` is a host tensor or a device array the recipe starts from.
    kind "op":    `op` (a functional ATen overload with a lowering) of `args`/`kwargs`,
                  whose tensors are `Ref`s; `seed` keys a random op; `dtypes` are the
                  torch dtypes of its results (a tuple for a multi-output op).
    kind "write": the value of `args[0]` (a `Ref`) with the elements that the view
                  chain `args[1]` selects replaced by `args[2]` (a `Ref`).
    """
    __slots__ = ("kind", "op", "args", "kwargs", "seed", "value", "dtypes", "__weakref__")

    def __init__(self, kind, op=None, args=(), kwargs=None, seed=None, value=None, dtypes=None):
        self.kind, self.op, self.args, self.kwargs = kind, op, args, kwargs or {}
        self.seed, self.value, self.dtypes = seed, value, dtypes

    def deps(self):
        refs = pytree.tree_leaves((self.args, self.kwargs),
                                  is_leaf=lambda x: isinstance(x, Ref))
        return [r.node for r in refs if isinstance(r, Ref)]


class Ref(NamedTuple):
    """A tensor of a recipe: output `index` of `node` (None for its only output) seen
    through `chain`, a tuple of (view op, args, kwargs, output index) steps."""
    node: Node
    index: object
    chain: tuple
    shape: tuple
    dtype: torch.dtype


class Storage:
    """What the aliases of one lazy tensor share: `root` is the recipe of the whole value;
    a write through any alias replaces it. `meta` is a meta tensor with the value's shape,
    dtype and strides, whose views give the aliases theirs."""
    __slots__ = ("root", "meta", "backend")

    def __init__(self, root: Ref, meta, backend):
        self.root, self.meta, self.backend = root, meta, backend


def native(dtype) -> bool:
    """Whether JAX holds `dtype` as it is (not int64 as int32, float64 as float32)."""
    try:
        return to_torch_dtype(to_jax_dtype(dtype)) == dtype
    except (TypeError, KeyError):
        return False


def const_recipe(value) -> Ref:
    """A recipe that starts from a tensor's current value (snapshotted)."""
    if isinstance(value, DeviceTensor) and not value.is_view and not isinstance(value.cell.array, Absent):
        data = value.cell.array
    elif isinstance(value, LazyTensor):
        data = value.materialize()
    else:
        if isinstance(value, DeviceTensor):
            value = value.host()
        data = value.detach().clone()
    return Ref(Node("const", value=data, dtypes=value.dtype), None, (),
                tuple(value.shape), value.dtype)
