"""Resampling: nearest/linear upsampling, grid sampling and col2im (fold)."""
import numpy as np
import jax.numpy as jnp
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _out_sizes(x, nd, output_size, scale_factors):
    if output_size:
        return list(output_size), [None] * nd
    sizes = [int(np.floor(n * s)) for n, s in zip(x.shape[-nd:], scale_factors)]
    return sizes, list(scale_factors)


def _nearest_axis(x, axis, out, scale, exact=False):
    n = x.shape[axis]
    ratio = (1.0 / scale) if scale else n / out
    pos = (np.arange(out) + (0.5 if exact else 0.0)) * ratio
    src = np.minimum(np.floor(pos).astype(np.int64), n - 1)
    return jnp.take(x, jnp.asarray(src), axis=axis)


def _linear_axis(x, axis, out, scale, align_corners):
    n = x.shape[axis]
    if align_corners:
        pos = np.arange(out) * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        ratio = (1.0 / scale) if scale else n / out
        pos = np.maximum((np.arange(out) + 0.5) * ratio - 0.5, 0.0)
    lo = np.minimum(np.floor(pos).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    w = jnp.asarray((pos - lo).astype(np.float32), x.dtype)
    shape = [1] * x.ndim
    shape[axis] = out
    w = w.reshape(shape)
    a, b = jnp.take(x, jnp.asarray(lo), axis=axis), jnp.take(x, jnp.asarray(hi), axis=axis)
    return a * (1 - w) + b * w


def _upsample_nearest(nd, exact=False):
    def fn(x, output_size, scale_factors=None):
        sizes, scales = _out_sizes(x, nd, output_size, scale_factors)
        for i, (o, s) in enumerate(zip(sizes, scales)):
            x = _nearest_axis(x, x.ndim - nd + i, o, s, exact)
        return x
    return fn


def _upsample_linear(nd):
    def fn(x, output_size, align_corners, scale_factors=None):
        sizes, scales = _out_sizes(x, nd, output_size, scale_factors)
        for i, (o, s) in enumerate(zip(sizes, scales)):
            x = _linear_axis(x, x.ndim - nd + i, o, s, align_corners)
        return x
    return fn


for _nd in (1, 2, 3):
    lowering(getattr(aten, f"upsample_nearest{_nd}d").vec)(_upsample_nearest(_nd))
    lowering(getattr(aten, f"_upsample_nearest_exact{_nd}d").vec)(_upsample_nearest(_nd, True))
lowering(aten.upsample_linear1d.vec)(_upsample_linear(1))
lowering(aten.upsample_bilinear2d.vec)(_upsample_linear(2))
lowering(aten.upsample_trilinear3d.vec)(_upsample_linear(3))


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Bilinear (0) or nearest (1) sampling with zeros (0) or border (1) padding."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):
        raise NotImplementedError("grid_sampler_2d: only bilinear/nearest sampling with "
                                  "zeros/border padding is lowered")
    n, c, h, w = x.shape

    def unnorm(coord, size):
        if align_corners:
            return (coord + 1) / 2 * (size - 1)
        return ((coord + 1) * size - 1) / 2
    gx, gy = unnorm(grid[..., 0], w), unnorm(grid[..., 1], h)
    if padding_mode == 1:
        gx, gy = jnp.clip(gx, 0, w - 1), jnp.clip(gy, 0, h - 1)
    batch = jnp.arange(n)[:, None, None]

    def at(iy, ix):
        valid = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        v = x[batch, :, jnp.clip(iy, 0, h - 1), jnp.clip(ix, 0, w - 1)]  # n, oh, ow, c
        return jnp.where(valid[..., None], v, 0)
    if interpolation_mode == 1:
        out = at(jnp.round(gy).astype(jnp.int32), jnp.round(gx).astype(jnp.int32))
    else:
        x0, y0 = jnp.floor(gx), jnp.floor(gy)
        wx, wy = (gx - x0)[..., None], (gy - y0)[..., None]
        x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
        out = (at(y0, x0) * (1 - wx) * (1 - wy) + at(y0, x0 + 1) * wx * (1 - wy)
               + at(y0 + 1, x0) * (1 - wx) * wy + at(y0 + 1, x0 + 1) * wx * wy)
    return jnp.moveaxis(out, -1, 1)


@lowering(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    n, ckk, _ = x.shape
    kh, kw = kernel_size
    c = ckk // (kh * kw)
    oh, ow = output_size
    ph, pw = padding
    bh = (oh + 2 * ph - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    bw = (ow + 2 * pw - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = x.reshape(n, c, kh, kw, bh, bw)
    out = jnp.zeros((n, c, oh + 2 * ph, ow + 2 * pw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilation[0], j * dilation[1]
            out = out.at[:, :, r0:r0 + stride[0] * bh:stride[0],
                         c0:c0 + stride[1] * bw:stride[1]].add(cols[:, :, i, j])
    out = out[:, :, ph:ph + oh, pw:pw + ow]
    return out if batched else out[0]
