"""A tensor's layout over a mesh of boxes, as an op of the captured graph.

`mesh_layout(x, systems, shape, split)` computes ``x`` itself; what it says is where
``x`` lives: on the mesh of boxes of `shape`, whose boxes are the systems `systems`
(row-major), each box axis ``i`` splitting tensor dimension ``split[i]`` (-1: the box
axis holds copies). It lowers to `jax.lax.with_sharding_constraint`, from which XLA's
SPMD partitioner makes the slices and all-gathers. The jax mesh comes from whoever lowers
the step (`box_meshes`); without one the op lowers to its input, as on a single device.
Its gradient has the same layout, as JAX gives the transpose of a sharding constraint.
"""
import contextlib
import contextvars
from collections.abc import Callable

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec
from torch import Tensor

from bridge.ops.registry import lowering

# (systems, shape) -> the jax Mesh whose leading axes are the boxes' axes, in order.
_resolver: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "bridge_box_meshes", default=None)


@contextlib.contextmanager
def box_meshes(resolver: Callable | None):
    """Lower `mesh_layout` ops with ``resolver(systems, shape) -> jax.sharding.Mesh`` while
    inside (None: the ops lower to their input)."""
    token = _resolver.set(resolver)
    try:
        yield
    finally:
        _resolver.reset(token)


@torch.library.custom_op("bridge::mesh_layout", mutates_args=())
def mesh_layout(x: Tensor, systems: list[int], shape: list[int], split: list[int]) -> Tensor:
    return x.clone()


@mesh_layout.register_fake
def _(x, systems, shape, split):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    _, ctx.systems, ctx.shape, ctx.split = inputs


def _backward(ctx, grad):
    return torch.ops.bridge.mesh_layout(grad, ctx.systems, ctx.shape, ctx.split), None, None, None


mesh_layout.register_autograd(_backward, setup_context=_setup_context)

MESH_LAYOUT = torch.ops.bridge.mesh_layout.default


def partition_spec(ndim: int, split) -> PartitionSpec:
    """Per tensor dimension, the box axes ("box0", ...) that split it, in axis order."""
    dims = [tuple(f"box{axis}" for axis, d in enumerate(split) if d == dim) for dim in range(ndim)]
    return PartitionSpec(*(axes if len(axes) > 1 else (axes[0] if axes else None) for axes in dims))


@lowering(MESH_LAYOUT)
def _mesh_layout(x, systems, shape, split):
    resolver = _resolver.get()
    if resolver is None:
        return x
    sharding = NamedSharding(resolver(systems, shape), partition_spec(x.ndim, split))
    return jax.lax.with_sharding_constraint(x, sharding)
