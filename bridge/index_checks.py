"""Index bounds checked inside a lowered program.

XLA clamps or fills an out-of-range gather index where eager PyTorch raises
(`IndexError: Target 4 is out of bounds.`, `index out of range in self`): one bad label
trains silently on another class. With `bridge.lower(..., check_indices=True)` the program
also returns, for every op that takes indices, their smallest and largest value, and the
host compares them with the bounds known at capture (`IndexCheck.failure`). Reading them
is the caller's choice of when, so a step adds no host round trip.
"""
import linecache
from dataclasses import dataclass

import jax.numpy as jnp
import torch
from jax import lax
import torch.fx as fx

aten = torch.ops.aten


@dataclass(frozen=True)
class IndexCheck:
    """One index argument of one op: the values it may take, and where it came from."""
    op: str
    dim: int
    size: int
    low: int    # -size where eager takes negative indices, else 0
    where: str  # the user's line, as a traceback prints it

    def failure(self, smallest: int, largest: int) -> str | None:
        bad = smallest if smallest < self.low else largest if largest >= self.size else None
        if bad is None:
            return None
        return (f"index {bad} is out of bounds for dimension {self.dim} with size {self.size} "
                f"in {self.op}{self.where}")


def _dim(value, dim):
    return dim % max(value.ndim, 1)


def _along(dim_arg, index_arg, low_negative=False):
    """Indices into `self` along its dimension `dim`: (self, dim, index, ...) ops."""
    def checks(args, kwargs):
        self, dim, index = args[0], args[dim_arg], args[index_arg]
        d = _dim(self, dim)
        size = self.shape[d] if self.ndim else 1
        return [(index, d, size, -size if low_negative else 0)]
    return checks


def _embedding(args, kwargs):
    return [(args[1], 0, args[0].shape[0], 0)]


def _embedding_backward(args, kwargs):
    return [(args[1], 0, args[2], 0)]


def _advanced(args, kwargs):
    """x[i, j]: each integer index tensor for its own dimension, negative ones counted
    from the end as eager does."""
    self, indices = args[0], args[1]
    found = []
    for d, index in enumerate(indices):
        if index is not None and jnp.issubdtype(index.dtype, jnp.integer):
            found.append((index, d, self.shape[d], -self.shape[d]))
    return found


# ATen op -> the index arguments it takes, as (indices, dim, size, lowest allowed).
CHECKS = {
    aten.gather.default: _along(1, 2),
    aten.index_select.default: _along(1, 2),
    aten.scatter.src: _along(1, 2),
    aten.scatter.value: _along(1, 2),
    aten.scatter.reduce: _along(1, 2),
    aten.scatter.value_reduce: _along(1, 2),
    aten.scatter_add.default: _along(1, 2),
    aten.scatter_reduce.two: _along(1, 2),
    aten.index_add.default: _along(1, 2),
    aten.index_copy.default: _along(1, 2),
    aten.index_fill.int_Scalar: _along(1, 2, low_negative=True),
    aten.index_fill.int_Tensor: _along(1, 2, low_negative=True),
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
    aten.index.Tensor: _advanced,
    aten.index_put.default: _advanced,
}


def bounds(node: fx.Node, args, kwargs, op_name: str, frame, seen: set):
    """(checks, [min, max] arrays) of `node`'s index arguments; empty for other ops.
    `frame` is the user's (path, line) that made the node, or None. An index array already
    checked against the same bounds (`seen`: the forward gather's targets, again in its
    backward scatter) is not checked again."""
    rule = CHECKS.get(node.target)
    if rule is None:
        return [], []
    where = _user_line(frame)
    checks, values = [], []
    for index, dim, size, low in rule(args, kwargs):
        if (id(index), size, low) in seen:
            continue
        seen.add((id(index), size, low))
        index = jnp.asarray(index)
        safe = 0 if size > 0 else low
        values.append(_smallest_and_largest(index, safe))
        checks.append(IndexCheck(op_name, int(dim), int(size), int(low), where))
    return checks, values


def _smallest_and_largest(index, initial):
    """[min, max] of `index` and `initial` as int32, from one reduction: XLA compiles one
    kernel for it where a min and a max took one each. XLA may apply a reduction's start
    value any number of times, so it must be the identity; `initial` is taken in after."""
    flat = index.reshape(-1)
    info = jnp.iinfo(flat.dtype)
    low, high = lax.reduce((flat, flat), (jnp.asarray(info.max, flat.dtype),
                                          jnp.asarray(info.min, flat.dtype)),
                           lambda a, b: (lax.min(a[0], b[0]), lax.max(a[1], b[1])), (0,))
    start = jnp.asarray(initial, flat.dtype)
    return jnp.stack([lax.min(low, start).astype(jnp.int32),
                      lax.max(high, start).astype(jnp.int32)])


def _user_line(frame) -> str:
    """The user's frame as a traceback prints it."""
    if frame is None:
        return ""
    path, line = frame
    text = linecache.getline(path, int(line)).strip()
    return f"\nIn the step, at:\n  File \"{path}\", line {line}" + (f"\n    {text}" if text else "")
