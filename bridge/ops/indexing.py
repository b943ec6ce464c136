"""Gathers, scatters, advanced indexing and embeddings."""
import functools
import math

import jax.numpy as jnp
import torch

from bridge.errors import DataDependentShapeError
from bridge.ops.registry import canonical_dim, lowering, scalar_as_vector

aten = torch.ops.aten


def _along(index, dim, ndim):
    """Full index tuple for scatter/gather along `dim` with `index` of the input's rank."""
    # jax 0.11 returns a tuple from meshgrid, earlier releases a list
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij"))
    grids[dim] = index
    return tuple(grids)


def _scatter_rules(fn):
    """ATen's scatter rules `fn` need not know: an empty index writes nothing, whatever its
    rank (a gather's backward scatters a (2, 0) index into a 1-d input); a 0-d input,
    its 0-d index and 0-d source act as 1-element vectors along dim 0 or -1."""

    @functools.wraps(fn)
    def wrapped(x, dim, index, src, *args, **kwargs):
        if index.size == 0:
            return x
        if x.ndim != 0:
            return fn(x, dim, index, src, *args, **kwargs)
        one = lambda a: a.reshape(1) if getattr(a, "ndim", None) == 0 else a
        return fn(x.reshape(1), 0, one(index), one(src), *args, **kwargs).reshape(())
    return wrapped


@lowering(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    if index.size == 0:  # ATen lets an empty index have any shape
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(index.shape)
    return x[_along(index, dim % x.ndim, x.ndim)]


def _one_per_row(x, dim, index):
    """The one-hot mask of an index with one entry per row along `dim` and `x`'s extent
    elsewhere (NLL's gradient scatters -1 at each target this way), else None. As a
    comparison the write fuses into what reads it; a scatter makes XLA write a whole
    array of the input first (the zeros of NLL's gradient)."""
    if index.shape[dim] != 1 or any(n != m for i, (n, m) in enumerate(zip(index.shape, x.shape))
                                    if i != dim):
        return None
    positions = jnp.arange(x.shape[dim]).reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    return positions == index


@lowering(aten.scatter.value)
@_scatter_rules
def scatter_value(x, dim, index, value):
    dim = dim % x.ndim
    mask = _one_per_row(x, dim, index)
    if mask is not None:
        return jnp.where(mask, jnp.asarray(value, x.dtype), x)
    return x.at[_along(index, dim, x.ndim)].set(value)


@lowering(aten.scatter.src)
@_scatter_rules
def scatter_src(x, dim, index, src):
    dim = dim % x.ndim
    src = src[tuple(slice(0, n) for n in index.shape)]
    mask = _one_per_row(x, dim, index)
    if mask is not None:
        return jnp.where(mask, src.astype(x.dtype), x)
    return x.at[_along(index, dim, x.ndim)].set(src)


@lowering(aten.scatter.value_reduce, aten.scatter.reduce)
@_scatter_rules
def scatter_reduce_legacy(x, dim, index, src, reduce):
    at = x.at[_along(index, dim % x.ndim, x.ndim)]
    if hasattr(src, "shape"):
        src = src[tuple(slice(0, n) for n in index.shape)]
    return at.add(src) if reduce == "add" else at.multiply(src)


@lowering(aten.scatter_add.default)
@_scatter_rules
def scatter_add(x, dim, index, src):
    src = src[tuple(slice(0, n) for n in index.shape)]
    return x.at[_along(index, dim % x.ndim, x.ndim)].add(src)


@lowering(aten.scatter_reduce.two)
@_scatter_rules
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    src = src[tuple(slice(0, n) for n in index.shape)]
    idx = _along(index, dim % x.ndim, x.ndim)
    if reduce == "sum":
        base = x if include_self else x.at[idx].set(0)
        return base.at[idx].add(src)
    if reduce == "prod":
        base = x if include_self else x.at[idx].set(1)
        return base.at[idx].multiply(src)
    if reduce in ("amax", "amin"):
        fill = -jnp.inf if reduce == "amax" else jnp.inf
        if not jnp.issubdtype(x.dtype, jnp.floating):
            info = jnp.iinfo(x.dtype)
            fill = info.min if reduce == "amax" else info.max
        base = x if include_self else x.at[idx].set(fill)
        return base.at[idx].max(src) if reduce == "amax" else base.at[idx].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[idx].set(0)
        total = base.at[idx].add(src)
        count = jnp.ones_like(x) if include_self else jnp.zeros_like(x)
        count = count.at[idx].add(jnp.ones_like(src))
        count = jnp.where(count == 0, 1, count)
        out = total / count
        return out if jnp.issubdtype(x.dtype, jnp.floating) else jnp.floor_divide(total, count)
    raise NotImplementedError(f"scatter_reduce with reduce={reduce!r}")


def _index_tuple(x, indices):
    out = []
    for i in indices:
        if i is None:
            out.append(slice(None))
        elif i.dtype == jnp.bool_:
            raise DataDependentShapeError(
                "boolean-mask indexing gives a data-dependent shape, which XLA cannot compile; "
                "use torch.where(mask, x, other) instead")
        else:
            out.append(i)
    return tuple(out)


@lowering(aten.index.Tensor)
def index(x, indices):
    return x[_index_tuple(x, indices)]


def _masked_put(x, indices, values, accumulate):
    """``x[..., mask, ...] = values`` without the data-dependent count of True entries.

    Possible when `values` broadcasts along the selected entries (it has no dimension for
    them, or one of size 1): then every selected position gets the same slice, and the
    put is a `where` over the mask. Returns None when that does not hold.
    """
    real = [i for i in indices if i is not None]
    if len(real) != 1 or real[0].dtype != jnp.bool_:
        return None
    lead = next(p for p, i in enumerate(indices) if i is not None)
    mask = real[0]
    trailing = x.shape[lead + mask.ndim:]
    values = jnp.asarray(values, x.dtype)
    if values.ndim > len(trailing):
        if values.ndim > len(trailing) + 1 or values.shape[0] != 1:
            return None
        values = values[0]
    values = jnp.broadcast_to(values, trailing)
    full_mask = mask.reshape((1,) * lead + mask.shape + (1,) * len(trailing))
    full_values = values.reshape((1,) * (lead + mask.ndim) + trailing)
    if accumulate:
        return x + jnp.where(full_mask, full_values, 0).astype(x.dtype)
    return jnp.where(full_mask, full_values, x)


@lowering(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    masked = _masked_put(x, indices, values, accumulate)
    if masked is not None:
        return masked
    at = x.at[_index_tuple(x, indices)]
    return at.add(values) if accumulate else at.set(values)


@lowering(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:
        return x.reshape(1)[index.reshape(-1)].reshape(())
    return jnp.take(x, index, axis=dim)


@lowering(aten.index_add.default)
def index_add(x, dim, index, source, alpha=1):
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].add(source * alpha)


@lowering(aten.index_copy.default)
def index_copy(x, dim, index, source):
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(source)


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(value)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat_idx = indices.reshape(-1)
    flat_grad = grad.reshape(flat_idx.shape[0], -1)
    if padding_idx >= 0:
        flat_grad = jnp.where((flat_idx == padding_idx)[:, None], 0, flat_grad)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, grad.dtype).at[flat_idx].add(1)
        flat_grad = flat_grad / counts[flat_idx][:, None]
    out = jnp.zeros((num_weights, flat_grad.shape[1]), grad.dtype).at[flat_idx].add(flat_grad)
    return out.reshape((num_weights,) + grad.shape[indices.ndim:])


@lowering(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    # Rows looked up by `indices` whose norm exceeds max_norm are scaled down to it
    # (with ATen's 1e-7 guard); the other rows are left alone.
    used = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True)
    norm = jnp.sum(jnp.abs(weight) ** norm_type, axis=-1) ** (1.0 / norm_type)
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return weight * scale[:, None].astype(weight.dtype)


@lowering(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    flat_mask = mask.reshape(-1)
    # the k-th True position takes source[k]
    order = jnp.cumsum(flat_mask) - 1
    src = source.reshape(-1)
    taken = src[jnp.clip(order, 0, max(src.shape[0] - 1, 0))] if src.shape[0] else x.reshape(-1)
    return jnp.where(flat_mask, taken, x.reshape(-1)).reshape(x.shape)


@lowering(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    """The source's gradient of `masked_scatter`: ATen's ``grad.masked_select(mask)``
    padded with zeros to the source's size. The k-th True position (in row-major order of
    grad and mask broadcast together) writes element k; the count of True positions only
    moves values, so the shape stays static."""
    shape = jnp.broadcast_shapes(grad.shape, mask.shape)
    flat_grad = jnp.broadcast_to(grad, shape).reshape(-1)
    flat_mask = jnp.broadcast_to(mask, shape).reshape(-1)
    numel = math.prod(sizes)
    slot = jnp.where(flat_mask, jnp.cumsum(flat_mask) - 1, numel)  # numel: dropped
    out = jnp.zeros((numel,), grad.dtype).at[slot].set(flat_grad, mode="drop")
    return out.reshape(tuple(sizes))


@lowering(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    idx = index.reshape(-1)
    idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
    at = flat.at[idx]
    return (at.add(source.reshape(-1)) if accumulate else at.set(source.reshape(-1))).reshape(x.shape)


@lowering(aten.index_reduce.default)
@scalar_as_vector
def index_reduce(x, dim, index, source, reduce, include_self=True):
    d = canonical_dim(x, dim)
    moved = jnp.moveaxis(x, d, 0)
    src = jnp.moveaxis(source, d, 0) if source.ndim else source.reshape(1)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    if reduce == "prod":
        base = moved if include_self else moved.at[index].set(1)
        out = base.at[index].multiply(src)
    elif reduce in ("amax", "amin"):
        fill = (-jnp.inf if reduce == "amax" else jnp.inf) if floating else \
            (jnp.iinfo(x.dtype).min if reduce == "amax" else jnp.iinfo(x.dtype).max)
        base = moved if include_self else moved.at[index].set(fill)
        out = base.at[index].max(src) if reduce == "amax" else base.at[index].min(src)
    else:  # mean
        base = moved if include_self else moved.at[index].set(0)
        total = base.at[index].add(src)
        count = jnp.zeros(moved.shape[0], x.dtype).at[index].add(1)
        count = count + (1 if include_self else 0)
        count = jnp.where(count == 0, 1, count).reshape((-1,) + (1,) * (moved.ndim - 1))
        out = total / count if floating else jnp.floor_divide(total, count)
    return jnp.moveaxis(out, 0, d)


@lowering(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    if x.ndim == 0:  # ATen: a 0-d input gives (size, 0) indices, `size` rows of nothing
        return jnp.zeros((size, 0), jnp.int32)
    if x.size == 0:  # jnp.nonzero pads an empty input with 0s, not fill_value
        return jnp.full((size, x.ndim), fill_value, jnp.int32)
    idx = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=-1)


def _bag_of(n, offsets, bags):
    """The bag each of `n` flattened indices falls in (ATen's `offset2bag`)."""
    return jnp.searchsorted(offsets[:bags], jnp.arange(n), side="right") - 1


def _kept(indices, padding_idx):
    if padding_idx is not None and padding_idx >= 0:
        return indices != padding_idx
    return jnp.ones(indices.shape, bool)


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags given by 1-D `indices` and `offsets` (mode 0 sum, 1 mean, 2 max). The other
    outputs are what the backward reads, shaped as ATen's: offset2bag (empty in sum mode
    without padding_idx), the bag sizes, and in max mode the weight row each maximum
    came from (0 for an empty bag, as ATen gives)."""
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag_of = _bag_of(n, offsets, bags)
    rows = weight[indices]
    keep = _kept(indices, padding_idx)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    rows = jnp.where(keep[:, None], rows, 0)
    counts = jnp.zeros(bags, weight.dtype).at[bag_of].add(keep.astype(weight.dtype))
    sizes = counts.astype(jnp.int32)
    extra = sizes
    if mode == 2:
        best = jnp.full((bags, weight.shape[1]), -jnp.inf, weight.dtype).at[bag_of].max(
            jnp.where(keep[:, None], rows, -jnp.inf))
        out = jnp.where(counts[:, None] > 0, best, 0)
        # the first row reaching the maximum, as ATen's kernel keeps the first on ties
        hit = keep[:, None] & (rows == best[bag_of])
        first = jnp.full(best.shape, n).at[bag_of].min(jnp.where(hit, jnp.arange(n)[:, None], n))
        extra = jnp.concatenate([indices, jnp.zeros((1,), indices.dtype)])[first]
    else:
        out = jnp.zeros((bags, weight.shape[1]), weight.dtype).at[bag_of].add(rows)
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None]
    padded = padding_idx is not None and padding_idx >= 0
    offset2bag = bag_of if mode != 0 or padded else jnp.zeros((0,), jnp.int32)
    return out, offset2bag, sizes, extra


def _bag_weight_grad(grad, indices, bag_of, bag_size, maximum_indices, num_weights,
                     scale_grad_by_freq, mode, per_sample_weights, padding_idx):
    out = jnp.zeros((num_weights, grad.shape[1]), grad.dtype)
    if mode == 2:
        # each output element came from one weight element; empty bags from none
        rows = jnp.where(bag_size[:, None] > 0, maximum_indices, num_weights)
        return out.at[rows, jnp.arange(grad.shape[1])].add(grad, mode="drop")
    rows = grad[bag_of]
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[bag_of], 1).astype(grad.dtype)[:, None]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    if scale_grad_by_freq:
        freq = jnp.zeros(num_weights, grad.dtype).at[indices].add(1)
        rows = rows / freq[indices][:, None]
    rows = jnp.where(_kept(indices, padding_idx)[:, None], rows, 0)
    return out.at[indices].add(rows)


@lowering(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, padding_idx=-1):
    """The dense weight gradient (a `sparse=True` bag gets it dense too). The bags are
    recomputed from `offsets`: ATen's forward leaves `offset2bag` empty in sum mode."""
    bag_of = _bag_of(indices.shape[0], offsets, grad.shape[0])
    return _bag_weight_grad(grad, indices, bag_of, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowering(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                 num_weights, scale_grad_by_freq, mode,
                                 per_sample_weights, padding_idx=-1):
    return _bag_weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowering(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    """Sum mode only (ATen refuses weights otherwise): each weight scaled one row."""
    bag_of = _bag_of(indices.shape[0], offsets, grad.shape[0])
    dots = jnp.sum(grad[bag_of] * weight[indices], axis=1)
    return jnp.where(_kept(indices, padding_idx), dots, 0)


@lowering(aten.nonzero.default)
def nonzero(x):
    raise DataDependentShapeError(
        "aten.nonzero has a data-dependent output shape, which XLA cannot compile; use "
        "torch.nonzero_static(x, size=...) or torch.where(mask, a, b) instead")
