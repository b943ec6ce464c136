"""Ops outside the other families: order statistics, searching, histograms, FFTs,
padding modes, 3-D pooling, scatter-by-mask and the group-norm backward.

Backward ops here are the VJPs of their forwards, so they cannot drift apart.
"""
import numpy as np
import jax
import jax.numpy as jnp
import torch

from bridge.dtypes import to_jax_dtype
from bridge.ops.pooling import _avg_pool
from bridge.ops.random import next_key
from bridge.errors import DataDependentShapeError
from bridge.ops.registry import lowering, scalar_as_vector

aten = torch.ops.aten


def _dim(x, dim):
    return dim % x.ndim if x.ndim else 0


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
    v, i = _lower_median(x, _dim(x, dim), False)
    return (jnp.expand_dims(v, _dim(x, dim)), jnp.expand_dims(i, _dim(x, dim))) if keepdim and x.ndim else (v, i)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, dim=0, keepdim=False):
    v, i = _lower_median(x, _dim(x, dim), True)
    return (jnp.expand_dims(v, _dim(x, dim)), jnp.expand_dims(i, _dim(x, dim))) if keepdim and x.ndim else (v, i)


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    d = _dim(x, dim)
    idx = jnp.argsort(x, axis=d, stable=True)
    i = jnp.take(idx, jnp.array([k - 1]), axis=d)
    v = jnp.take_along_axis(x, i, axis=d)
    return (v, i) if keepdim else (jnp.squeeze(v, d), jnp.squeeze(i, d))


@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    d = _dim(x, dim)
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
    flat_s = seq.reshape(-1, seq.shape[-1])
    flat_x = x.reshape(flat_s.shape[0], -1)
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_s, flat_x)
    return out.reshape(x.shape)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, jnp.asarray(x), side="right" if right else "left")


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    x = x.reshape(-1)
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    auto = (min == 0) and (max == 0)
    if auto:
        lo, hi = jnp.min(x, initial=jnp.inf), jnp.max(x, initial=-jnp.inf)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    pos = ((x - lo) / (hi - lo) * bins).astype(jnp.int32)
    pos = jnp.where(x == hi, bins - 1, pos)
    inside = (x >= lo) & (x <= hi)
    return jnp.zeros(bins, x.dtype).at[jnp.where(inside, pos, bins)].add(1, mode="drop")


@lowering(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    return jax.lax.cumlogsumexp(x, axis=_dim(x, dim))


@lowering(aten.angle.default)
def angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = x.astype(jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@lowering(aten._conj_copy.default, aten.conj_physical.default, aten.resolve_conj.default,
          aten.resolve_neg.default)
def conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowering(aten.frexp.Tensor)
def frexp(x):
    m, e = jnp.frexp(x)
    return m, e.astype(jnp.int32)


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
    d = _dim(x, dim)
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


@lowering(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(x, low_or_high, high=None, dtype=None, layout=None, device=None,
                 pin_memory=None, memory_format=None):
    low, high = (0, low_or_high) if high is None else (low_or_high, high)
    dt = to_jax_dtype(dtype) if dtype is not None else x.dtype
    return jax.random.randint(next_key(), x.shape, low, high).astype(dt)


@lowering(aten.multinomial.default)
def multinomial(probs, num_samples, replacement=False, generator=None):
    logits = jnp.log(probs)
    shape = probs.shape[:-1] + (num_samples,)
    if replacement:
        return jax.random.categorical(next_key(), logits[..., None, :], shape=shape)
    # without replacement: the top-k of Gumbel-perturbed logits
    g = jax.random.gumbel(next_key(), probs.shape)
    return jax.lax.top_k(logits + g, num_samples)[1]


@lowering(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    if x.ndim == 0:  # ATen: a 0-d input gives (size, 0) indices, `size` rows of nothing
        return jnp.zeros((size, 0), jnp.int32)
    if x.size == 0:  # jnp.nonzero pads an empty input with 0s, not fill_value
        return jnp.full((size, x.ndim), fill_value, jnp.int32)
    idx = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=-1)


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _dim(x, dim1), _dim(x, dim2)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    n, m = moved.shape[-2:]
    k = src.shape[-1]
    rows = jnp.arange(k) + max(-offset, 0)
    cols = jnp.arange(k) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src)
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


# --- padding modes --------------------------------------------------------------------

def _pad(x, padding, mode):
    nd = len(padding) // 2
    pads = [(0, 0)] * (x.ndim - nd)
    for i in reversed(range(nd)):
        pads.append((padding[2 * i], padding[2 * i + 1]))
    # negative padding crops
    crop = tuple(slice(max(-lo, 0), x.shape[j] - max(-hi, 0)) for j, (lo, hi) in enumerate(pads))
    x = x[crop]
    return jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in pads], mode=mode)


for _n in (1, 2, 3):
    lowering(getattr(aten, f"reflection_pad{_n}d").default)(lambda x, p: _pad(x, p, "reflect"))
    lowering(getattr(aten, f"replication_pad{_n}d").default)(lambda x, p: _pad(x, p, "edge"))
    for _kind, _mode in (("reflection", "reflect"), ("replication", "edge")):
        def _bwd(grad, x, p, _mode=_mode):
            _, vjp = jax.vjp(lambda v: _pad(v, p, _mode), x)
            return vjp(grad)[0]
        lowering(getattr(aten, f"{_kind}_pad{_n}d_backward").default)(_bwd)


@lowering(aten._pad_circular.default)
def pad_circular(x, padding):
    return _pad(x, padding, "wrap")


# --- 3-D and adaptive pooling --------------------------------------------------------

@lowering(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


@lowering(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _, vjp = jax.vjp(lambda v: avg_pool3d(v, kernel_size, stride, padding, ceil_mode,
                                          count_include_pad, divisor_override), x)
    return vjp(grad)[0]


def _adaptive(x, output_size, reduce):
    nd = len(output_size)
    lead = x.ndim - nd
    out = x
    for axis_i, o in enumerate(output_size):
        axis = lead + axis_i
        n = out.shape[axis]
        pieces = [reduce(jax.lax.slice_in_dim(out, (i * n) // o, -(-((i + 1) * n) // o), axis=axis),
                         axis) for i in range(o)]
        out = jnp.stack(pieces, axis=axis)
    return out


@lowering(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive(x, list(output_size), lambda v, a: jnp.mean(v, axis=a))


@lowering(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    _, vjp = jax.vjp(lambda v: adaptive_avg_pool3d(v, grad.shape[-3:]), x)
    return vjp(grad)[0]


def _adaptive_max(x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    spatial = x.shape[lead:]
    flat_idx = jnp.broadcast_to(jnp.arange(int(np.prod(spatial)), dtype=jnp.int32).reshape(spatial),
                                x.shape)
    # one window per output cell: fine for the small output sizes adaptive pooling uses
    cells = np.ndindex(*output_size)
    vals, idxs = [], []
    for cell in cells:
        sl = [slice(None)] * lead
        for c, o, n in zip(cell, output_size, spatial):
            sl.append(slice((c * n) // o, -(-((c + 1) * n) // o)))
        win = x[tuple(sl)].reshape(x.shape[:lead] + (-1,))
        wid = flat_idx[tuple(sl)].reshape(x.shape[:lead] + (-1,))
        a = jnp.argmax(win, axis=-1)
        vals.append(jnp.take_along_axis(win, a[..., None], -1)[..., 0])
        idxs.append(jnp.take_along_axis(wid, a[..., None], -1)[..., 0])
    shape = x.shape[:lead] + tuple(output_size)
    return jnp.stack(vals, -1).reshape(shape), jnp.stack(idxs, -1).reshape(shape)


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    return _adaptive_max(x, list(output_size))


@lowering(aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool_backward(grad, x, indices):
    spatial_nd = 2 if x.shape[:-2] == grad.shape[:-2] else 3
    lead = x.ndim - spatial_nd
    flat = jnp.zeros(x.shape[:lead] + (int(np.prod(x.shape[lead:])),), grad.dtype)
    g = grad.reshape(grad.shape[:lead] + (-1,))
    i = indices.reshape(indices.shape[:lead] + (-1,))
    out = jax.vmap(lambda f, ii, gg: f.at[ii].add(gg))(
        flat.reshape(-1, flat.shape[-1]), i.reshape(-1, i.shape[-1]), g.reshape(-1, g.shape[-1]))
    return out.reshape(x.shape)


# --- group norm backward -------------------------------------------------------------

@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hw, group, mask):
    shape = [1, -1] + [1] * (x.ndim - 2)
    xhat = ((x.reshape(n, group, -1) - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    dxhat = grad * weight.reshape(shape) if weight is not None else grad
    g_dxhat = dxhat.reshape(n, group, -1)
    g_xhat = xhat.reshape(n, group, -1)
    gx = rstd[..., None] * (g_dxhat - jnp.mean(g_dxhat, -1, keepdims=True)
                            - g_xhat * jnp.mean(g_dxhat * g_xhat, -1, keepdims=True))
    axes = (0,) + tuple(range(2, x.ndim))
    return (gx.reshape(x.shape) if mask[0] else None,
            jnp.sum(grad * xhat, axis=axes) if mask[1] else None,
            jnp.sum(grad, axis=axes) if mask[2] else None)


# --- FFT ---------------------------------------------------------------------------

def _norm_scale(norm, n, forward):
    # torch's normalization code: 0 none, 1 1/sqrt(n), 2 1/n
    if norm == 0:
        return 1.0
    if norm == 1:
        return 1.0 / np.sqrt(n)
    return 1.0 / n


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    dim = [d % x.ndim for d in dim]
    out = jnp.fft.fftn(x.astype(jnp.complex64), axes=dim)
    n = int(np.prod([x.shape[d] for d in dim]))
    out = out * _norm_scale(normalization, n, True)
    if onesided:
        last = dim[-1]
        out = jax.lax.slice_in_dim(out, 0, x.shape[last] // 2 + 1, axis=last)
    return out


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    dim = [d % x.ndim for d in dim]
    n = int(np.prod([x.shape[d] for d in dim]))
    out = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim) * n
    return out * _norm_scale(normalization, n, forward)


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    dim = [d % x.ndim for d in dim]
    shape = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=shape, axes=dim) * int(np.prod(shape))
    return out * _norm_scale(normalization, int(np.prod(shape)), False)


# --- remaining core ops --------------------------------------------------------------

@lowering(aten.var.dim)
def var_dim(x, dim=None, unbiased=True, keepdim=False):
    axes = None if dim is None or x.ndim == 0 or len(dim) == 0 else tuple(d % x.ndim for d in dim)
    return jnp.var(x, axis=axes, ddof=1 if unbiased else 0, keepdims=keepdim)


@lowering(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The out-of-place form: running stats are updated by the functional variant."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = [1, -1] + [1] * (x.ndim - 2)
    if training:
        mean, var = jnp.mean(x, axis=axes), jnp.var(x, axis=axes)
    else:
        mean, var = running_mean, running_var
    rstd = 1 / jnp.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    if not training:
        return out, jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)
    return out, mean, rstd


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags given by 1-D `indices` and `offsets` (mode 0 sum, 1 mean, 2 max)."""
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag_of = jnp.searchsorted(offsets[:bags], jnp.arange(n), side="right") - 1
    rows = weight[indices]
    keep = indices != padding_idx if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(n, bool)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    rows = jnp.where(keep[:, None], rows, 0)
    counts = jnp.zeros(bags, weight.dtype).at[bag_of].add(keep.astype(weight.dtype))
    if mode == 2:
        out = jnp.full((bags, weight.shape[1]), -jnp.inf, weight.dtype).at[bag_of].max(
            jnp.where(keep[:, None], rows, -jnp.inf))
        out = jnp.where(counts[:, None] > 0, out, 0)
    else:
        out = jnp.zeros((bags, weight.shape[1]), weight.dtype).at[bag_of].add(rows)
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None]
    zero = jnp.zeros((0,), jnp.int32)
    return out, zero, counts.astype(jnp.int32), zero


@lowering(aten._local_scalar_dense.default)
def local_scalar_dense(x):
    # Under jit this is a traced scalar; graphs only keep it where its value feeds tensors.
    return x.reshape(())


@lowering(aten.nonzero.default)
def nonzero(x):
    raise DataDependentShapeError(
        "aten.nonzero has a data-dependent output shape, which XLA cannot compile; use "
        "torch.nonzero_static(x, size=...) or torch.where(mask, a, b) instead")


@lowering(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(x, output_size):
    return _adaptive(x, list(output_size), lambda v, a: jnp.mean(v, axis=a))


@lowering(aten._linalg_check_errors.default)
def linalg_check_errors(info, api_name, is_matrix):
    # XLA's factorizations report no errors (info is always 0), so there is nothing to check.
    return None


@lowering(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(*args, **kwargs):
    # export's dtype/shape guards: shapes and dtypes are static once lowered, so they hold.
    return None
