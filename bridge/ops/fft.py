"""Discrete Fourier transforms (`_fft_r2c`, `_fft_c2c`, `_fft_c2r`)."""
import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


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
