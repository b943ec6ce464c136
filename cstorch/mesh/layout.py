"""Laying tensors out over a mesh of boxes, and moving them between layouts.

Off a Cerebras cluster the real package computes nothing here: every function returns
its tensor. Here, inside a step traced on a CSX backend, the cluster is the emulated one
(`num_csx` systems beside each system's wafer grid), and a layout is a sharding of the
lowered program: `distribute_tensor`, `all_slice` and `all_gather` put a
`bridge::mesh_layout` op into the captured graph, which lowers to
`jax.lax.with_sharding_constraint` on the backend's devices; XLA's SPMD partitioner then
makes the slices and all-gathers. Along a box axis a tensor is split or copied as its
layout says; on each box's wafer it is whole. Values never change. On CPU and GPU
backends, and outside a traced step, each function returns its tensor unchanged.
"""
import warnings

import torch

import wafer
from cstorch.backend import current_backend_impl
from cstorch.mesh.boxes import Mesh, cluster_mesh, mesh_of
from cstorch.mesh.placement import ShardingSpec, split_axes_of

# The attribute a tensor made by a layout function carries: (mesh, split axes), so that
# a later all_gather or all_slice knows the mesh and the splits it starts from.
_LAYOUT = "_cstorch_mesh_layout"


def _cluster():
    """The CSX backend whose step is being traced now, or None."""
    backend = current_backend_impl(raise_exception=False)
    if backend is None or not backend.is_csx or not torch.compiler.is_compiling():
        return None
    return backend


def _check_tensor(tensor, fn):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"cstorch.mesh.{fn} expects a torch.Tensor, got {type(tensor).__name__}")


def _lay_out(tensor: torch.Tensor, mesh: Mesh, split, backend) -> torch.Tensor:
    """`tensor` constrained to lie on `mesh` with mesh axis i splitting dimension split[i]."""
    # Refuses, at the user's line, a mesh the program could not be laid out on.
    wafer.box_mesh(backend.mesh, mesh.systems, mesh.shape)
    dims = []
    for axis, dim in enumerate(split):
        if dim is None:
            dims.append(-1)
            continue
        if not -tensor.dim() <= dim < tensor.dim() or tensor.dim() == 0:
            raise IndexError(f"mesh axis {axis} shards dimension {dim} of a tensor of "
                             f"{tensor.dim()} dimensions (shape {tuple(tensor.shape)})")
        dims.append(dim % tensor.dim())
    out = torch.ops.bridge.mesh_layout(tensor, mesh.systems, list(mesh.shape), dims)
    setattr(out, _LAYOUT, (mesh, tuple(None if d < 0 else d for d in dims)))
    return out


def distribute_tensor(tensor, sharding_spec, names):
    """Lay `tensor` out as `sharding_spec` (a `ShardingSpec`, see `sharding_spec`) says.
    `names` is taken as the reference takes it; it changes neither the layout nor the values."""
    backend = _cluster()
    if backend is None:
        return tensor
    _check_tensor(tensor, "distribute_tensor")
    if not isinstance(sharding_spec, ShardingSpec):
        raise TypeError(f"distribute_tensor expects a cstorch.mesh.ShardingSpec, got "
                        f"{type(sharding_spec).__name__}")
    if sharding_spec.partial_axes:
        raise NotImplementedError(
            f"distribute_tensor: partial_axes {sharding_spec.partial_axes} would make each box "
            f"hold a part of a sum, which a whole tensor cannot be laid out as")
    if sharding_spec.devices is not None:
        raise NotImplementedError("distribute_tensor: a ShardingSpec restricted to devices "
                                  f"{sharding_spec.devices!r} is not supported; use devices=None")
    mesh = mesh_of(sharding_spec.mesh_id)
    if len(sharding_spec.split_axes) != mesh.ndim:
        raise ValueError(f"ShardingSpec has {len(sharding_spec.split_axes)} split axes for mesh "
                         f"{sharding_spec.mesh_id!r} of {mesh.ndim} axes")
    return _lay_out(tensor, mesh, sharding_spec.split_axes, backend)


def _current(tensor, backend):
    """The mesh and split axes `tensor` was laid out with; without a layout, the cluster's
    systems in a row, splits unknown (None)."""
    layout = getattr(tensor, _LAYOUT, None)
    if layout is not None:
        return layout
    return cluster_mesh(backend.mesh.shape["systems"]), None


def all_gather(tensor, gather_axes):
    """Gather `tensor` along the mesh axes `gather_axes` (an int or a list of them): every
    box along them gets the whole of what they split, an all-gather in the program. The
    tensor keeps its splits along the other axes."""
    backend = _cluster()
    if backend is None:
        return tensor
    _check_tensor(tensor, "all_gather")
    axes = [gather_axes] if isinstance(gather_axes, int) else list(gather_axes)
    mesh, split = _current(tensor, backend)
    bad = [a for a in axes if not isinstance(a, int) or not -mesh.ndim <= a < mesh.ndim]
    if bad:
        raise IndexError(f"all_gather: gather axes {bad} are not axes of a mesh of shape "
                         f"{mesh.shape}")
    axes = {a % mesh.ndim for a in axes}
    if not axes:
        return tensor
    if split is None:
        # Not laid out here: its mesh is the cluster's one axis, which is being gathered.
        split = (None,) * mesh.ndim
    return _lay_out(tensor, mesh, [None if i in axes else d for i, d in enumerate(split)],
                    backend)


def all_slice(tensor, sharding_array, names):
    """Slice `tensor` as `sharding_array` (one `Shard(dim)` or `Replicate()` per mesh axis)
    says, on the mesh it was laid out on (without one, the cluster's systems in a row):
    each box keeps its slice, a dynamic slice in the program. `names` is taken as the
    reference takes it; it changes neither the layout nor the values."""
    backend = _cluster()
    if backend is None:
        return tensor
    _check_tensor(tensor, "all_slice")
    mesh, _ = _current(tensor, backend)
    return _lay_out(tensor, mesh, split_axes_of(sharding_array, mesh), backend)


_warned: set = set()


def placement_not_modelled(what: str):
    """Warn once that a placement request is taken but places nothing here."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"cstorch: {what} places nothing here: one program runs on every "
                      f"device of the emulated cluster, so the tensor's values are returned "
                      f"as they are and where a copy lives is not modelled", stacklevel=3)


def d2d_transfer(tensor, dst_device):
    """Send `tensor` to the box `dst_device`. A copy has the same values, and here one
    program runs on every box, so the tensor is returned as it is (with a warning, once)."""
    placement_not_modelled("d2d_transfer")
    return tensor


def m2m_transfer(tensor, src_mesh, dst_mesh, src_root_id=0):
    """Send `tensor` from the boxes of `src_mesh` (from box `src_root_id`) to those of
    `dst_mesh`. A copy has the same values, and here one program runs on every box, so the
    tensor is returned as it is (with a warning, once)."""
    placement_not_modelled("m2m_transfer")
    return tensor
