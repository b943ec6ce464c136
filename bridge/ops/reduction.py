"""Reductions: sums, means, extrema, norms, variances, softmax and its relatives."""
import jax
import jax.numpy as jnp
import torch

from bridge.convert import to_jax_dtype
from bridge.ops.opmath import HALF, in_float32
from bridge.ops.registry import canonical_dim, lowering, scalar_as_vector

aten = torch.ops.aten


def _axes(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if x.ndim == 0:  # torch accepts dim 0 / -1 on a scalar; reducing it is the identity
        return None
    if isinstance(dim, int):
        dim = [dim]
    return tuple(d % x.ndim for d in dim)


def _acc_dtype(x, dtype):
    if dtype is not None:
        return to_jax_dtype(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return to_jax_dtype(torch.int64)
    return None


@lowering(aten.sum.default)
def sum_all(x, dtype=None):
    return jnp.sum(x, dtype=_acc_dtype(x, dtype))


@lowering(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim, dtype=_acc_dtype(x, dtype))


@lowering(aten.mean.default)
def mean_all(x, dtype=None):
    return jnp.mean(x, dtype=to_jax_dtype(dtype) if dtype else None)


@lowering(aten.mean.dim)
def mean_dim(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(x, axis=_axes(x, dim), keepdims=keepdim,
                    dtype=to_jax_dtype(dtype) if dtype else None)


@lowering(aten.prod.default)
def prod_all(x, dtype=None):
    return jnp.prod(x, dtype=_acc_dtype(x, dtype))


@lowering(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, dtype=None):
    return jnp.prod(x, axis=_axes(x, dim), keepdims=keepdim, dtype=_acc_dtype(x, dtype))


@lowering(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.max.default)
def max_all(x):
    return jnp.max(x)


@lowering(aten.min.default)
def min_all(x):
    return jnp.min(x)


@lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return jnp.max(x, axis=dim, keepdims=keepdim), jnp.argmax(x, axis=dim, keepdims=keepdim)


@lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return jnp.min(x, axis=dim, keepdims=keepdim), jnp.argmin(x, axis=dim, keepdims=keepdim)


@lowering(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    if x.ndim == 0:
        return jnp.zeros((), jnp.int32)
    if dim is None:
        return jnp.argmax(x.reshape(-1))
    return jnp.argmax(x, axis=dim, keepdims=keepdim)


@lowering(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    if x.ndim == 0:
        return jnp.zeros((), jnp.int32)
    if dim is None:
        return jnp.argmin(x.reshape(-1))
    return jnp.argmin(x, axis=dim, keepdims=keepdim)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@lowering(aten.var.correction)
def var(x, dim=None, correction=None, keepdim=False):
    return jnp.var(x, axis=_axes(x, dim), ddof=_correction(correction, None), keepdims=keepdim)


@lowering(aten.var_mean.correction)
def var_mean(x, dim=None, correction=None, keepdim=False):
    axes = _axes(x, dim)
    return (jnp.var(x, axis=axes, ddof=_correction(correction, None), keepdims=keepdim),
            jnp.mean(x, axis=axes, keepdims=keepdim))


@lowering(aten.std.correction)
def std(x, dim=None, correction=None, keepdim=False):
    return jnp.std(x, axis=_axes(x, dim), ddof=_correction(correction, None), keepdims=keepdim)


@lowering(aten.linalg_vector_norm.default)
def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(to_jax_dtype(dtype))
    axes = _axes(x, dim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(x.dtype)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lowering(aten._softmax.default)
@scalar_as_vector
def softmax(x, dim, half_to_float=False):
    out = jnp.float32 if half_to_float else x.dtype
    return in_float32(lambda v: jax.nn.softmax(v, axis=dim), x, out_dtype=out)


@lowering(aten._log_softmax.default)
@scalar_as_vector
def log_softmax(x, dim, half_to_float=False):
    out = jnp.float32 if half_to_float else x.dtype
    return in_float32(lambda v: jax.nn.log_softmax(v, axis=dim), x, out_dtype=out)


@lowering(aten._softmax_backward_data.default)
@scalar_as_vector
def softmax_backward(grad, y, dim, input_dtype):
    return in_float32(lambda g, o: o * (g - jnp.sum(g * o, axis=dim, keepdims=True)), grad, y)


@lowering(aten._log_softmax_backward_data.default)
@scalar_as_vector
def log_softmax_backward(grad, y, dim, input_dtype):
    return in_float32(lambda g, o: g - jnp.exp(o) * jnp.sum(g, axis=dim, keepdims=True), grad, y)


@lowering(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    return jax.nn.logsumexp(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.cumsum.default)
def cumsum(x, dim, dtype=None):
    if dtype is None and x.dtype in HALF:   # a running sum accumulates in float32
        return in_float32(lambda v: jnp.cumsum(v, axis=dim if v.ndim else None), x
                          ).reshape(x.shape)
    return jnp.cumsum(x, axis=dim if x.ndim else None, dtype=_acc_dtype(x, dtype)).reshape(x.shape)


@lowering(aten.cumprod.default)
def cumprod(x, dim, dtype=None):
    return jnp.cumprod(x, axis=dim if x.ndim else None, dtype=_acc_dtype(x, dtype)).reshape(x.shape)


@lowering(aten.cummax.default)
@scalar_as_vector
def cummax(x, dim):
    values = jax.lax.cummax(x, axis=dim % x.ndim)
    idx = jnp.arange(x.shape[dim]).reshape([-1 if i == dim % x.ndim else 1 for i in range(x.ndim)])
    hit = jnp.where(x == values, idx, 0)
    return values, jax.lax.cummax(hit, axis=dim % x.ndim)


@lowering(aten.cummin.default)
@scalar_as_vector
def cummin(x, dim):
    values = jax.lax.cummin(x, axis=dim % x.ndim)
    idx = jnp.arange(x.shape[dim]).reshape([-1 if i == dim % x.ndim else 1 for i in range(x.ndim)])
    hit = jnp.where(x == values, idx, 0)
    return values, jax.lax.cummax(hit, axis=dim % x.ndim)


@lowering(aten.sort.default, aten.sort.stable)
def sort(x, dim=-1, descending=False, stable=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    # jnp's descending sort stays stable and puts NaN first, as ATen's does; negating the
    # key instead would send NaN last and overflow the smallest integer.
    idx = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(x, idx, axis=dim), idx


@lowering(aten.topk.default)
@scalar_as_vector
def topk(x, k, dim=-1, largest=True, sorted=True):
    moved = jnp.moveaxis(x, dim, -1)
    values, idx = jax.lax.top_k(moved if largest else -moved, k)
    if not largest:
        values = -values
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(idx, -1, dim)


@lowering(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    return jax.lax.cumlogsumexp(x, axis=canonical_dim(x, dim))


@lowering(aten.var.dim)
def var_dim(x, dim=None, unbiased=True, keepdim=False):
    axes = None if dim is None or x.ndim == 0 or len(dim) == 0 else tuple(d % x.ndim for d in dim)
    return jnp.var(x, axis=axes, ddof=1 if unbiased else 0, keepdims=keepdim)
