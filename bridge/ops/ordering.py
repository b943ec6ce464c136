"""Order statistics and searching: medians, k-th values, modes, sorted-sequence search."""
import jax
import jax.numpy as jnp
import torch

from bridge.ops.registry import canonical_dim, lowering

aten = torch.ops.aten


def _lower_median(x, dim, nan_last):
    """torch's median: the lower of the two middle values, its index along `dim`."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    moved = jnp.moveaxis(x, dim, -1)
    n = moved.shape[-1]
    idx = jnp.argsort(moved, axis=-1, stable=True)
    vals = jnp.take_along_axis(moved, idx, axis=-1)
    if nan_last:  # nanmedian: the median of the non-nan values
        count = jnp.sum(~jnp.isnan(moved), axis=-1)
        k = jnp.maximum((count - 1) // 2, 0)
    else:  # median: nan if any nan (nans sort last)
        has_nan = jnp.any(jnp.isnan(moved), axis=-1)
        k = jnp.where(has_nan, n - 1, (n - 1) // 2)
    k = k[..., None]
    return jnp.take_along_axis(vals, k, -1)[..., 0], jnp.take_along_axis(idx, k, -1)[..., 0]


@lowering(aten.median.default)
def median(x):
    return _lower_median(x.reshape(-1), 0, False)[0]


@lowering(aten.nanmedian.default)
def nanmedian(x):
    return _lower_median(x.reshape(-1), 0, True)[0]


@lowering(aten.median.dim)
def median_dim(x, dim=0, keepdim=False):
    v, i = _lower_median(x, canonical_dim(x, dim), False)
    if keepdim and x.ndim:
        return jnp.expand_dims(v, canonical_dim(x, dim)), jnp.expand_dims(i, canonical_dim(x, dim))
    return v, i


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, dim=0, keepdim=False):
    v, i = _lower_median(x, canonical_dim(x, dim), True)
    if keepdim and x.ndim:
        return jnp.expand_dims(v, canonical_dim(x, dim)), jnp.expand_dims(i, canonical_dim(x, dim))
    return v, i


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    d = canonical_dim(x, dim)
    idx = jnp.argsort(x, axis=d, stable=True)
    i = jnp.take(idx, jnp.array([k - 1]), axis=d)
    v = jnp.take_along_axis(x, i, axis=d)
    return (v, i) if keepdim else (jnp.squeeze(v, d), jnp.squeeze(i, d))


@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    d = canonical_dim(x, dim)
    moved = jnp.moveaxis(x, d, -1)
    n = moved.shape[-1]
    eq = moved[..., :, None] == moved[..., None, :]
    counts = jnp.sum(eq, axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    # torch picks the smallest of the most frequent values, and its last index
    cand = jnp.where(counts == best, moved, jnp.inf if jnp.issubdtype(x.dtype, jnp.floating)
                     else jnp.iinfo(x.dtype).max)
    v = jnp.min(cand, axis=-1)
    pos = jnp.where(moved == v[..., None], jnp.arange(n), -1)
    i = jnp.max(pos, axis=-1)
    if keepdim:
        v, i = jnp.expand_dims(v, d), jnp.expand_dims(i, d)
    return v, i


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, x, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    x = jnp.asarray(x)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    if seq.ndim == 1:
        return jnp.searchsorted(seq, x, side=side)
    if seq.shape[-1] == 0 or x.size == 0:  # nothing to search, or nothing to place
        return jnp.zeros(x.shape, jnp.int32)
    flat_s = seq.reshape(-1, seq.shape[-1])
    flat_x = x.reshape(flat_s.shape[0], -1)
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_s, flat_x)
    return out.reshape(x.shape)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, jnp.asarray(x), side="right" if right else "left")
