"""Resampling: nearest/linear upsampling, grid sampling and col2im (fold)."""
import jax
import jax.numpy as jnp
import numpy as np
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


def _taps_along(x, axis, src, weights):
    """out[i] = sum_k weights[i, k] * x[src[i, k]] along `axis`, from one gather: the
    backward (its transpose) is then one scatter, which XLA compiles much faster than
    one per tap."""
    out, k = src.shape
    taps = jnp.take(x, jnp.asarray(src.reshape(-1)), axis=axis)
    taps = taps.reshape(x.shape[:axis] + (out, k) + x.shape[axis + 1:])
    shape = [1] * taps.ndim
    shape[axis:axis + 2] = out, k
    w = jnp.asarray(weights.astype(np.float32), x.dtype).reshape(shape)
    return jnp.sum(taps * w, axis=axis + 1)


def _linear_axis(x, axis, out, scale, align_corners):
    n = x.shape[axis]
    if align_corners:
        pos = np.arange(out) * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        ratio = (1.0 / scale) if scale else n / out
        pos = np.maximum((np.arange(out) + 0.5) * ratio - 0.5, 0.0)
    lo = np.minimum(np.floor(pos).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    w = (pos - lo).astype(np.float32)
    return _taps_along(x, axis, np.stack([lo, hi], -1), np.stack([1 - w, w], -1))


def _cubic_coeffs(t, a=-0.75):
    """Weights of ATen's cubic convolution for the taps at -1, 0, 1, 2 around a point a
    fraction `t` past tap 0 (Keys' kernel with ATen's a = -0.75)."""
    near = lambda d: ((a + 2) * d - (a + 3)) * d * d + 1
    far = lambda d: ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _cubic_axis(x, axis, out, scale, align_corners):
    n = x.shape[axis]
    if align_corners:
        pos = np.arange(out) * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        # unlike linear, cubic does not clamp the source position at 0
        pos = (np.arange(out) + 0.5) * ((1.0 / scale) if scale else n / out) - 0.5
    base = np.floor(pos).astype(np.int64)
    src = np.clip(base[:, None] + np.arange(-1, 3), 0, n - 1)
    return _taps_along(x, axis, src, np.stack(_cubic_coeffs(pos - base), -1))


def _resample(x, nd, sizes, scales, axis_fn):
    """Resample the last `nd` axes, one axis at a time (every mode here is separable)."""
    for i, (o, s) in enumerate(zip(sizes, scales)):
        x = axis_fn(x, x.ndim - nd + i, o, s)
    return x


def _transpose(forward, grad, input_size):
    """The input gradient of a resampling. Each is linear in its input, so its VJP is the
    transpose of the very gathers the forward lowering uses: exact, and no second copy of
    the index arithmetic to keep in step with the forward."""
    _, vjp = jax.vjp(forward, jnp.zeros(tuple(input_size), grad.dtype))
    return vjp(grad)[0]


def _upsample_nearest(nd, exact=False):
    axis_fn = lambda x, axis, o, s: _nearest_axis(x, axis, o, s, exact)

    def fn(x, output_size, scale_factors=None):
        sizes, scales = _out_sizes(x, nd, output_size, scale_factors)
        return _resample(x, nd, sizes, scales, axis_fn)

    def backward(grad, output_size, input_size, *scales):
        scales = list(scales) + [None] * (nd - len(scales))
        forward = lambda x: _resample(x, nd, output_size, scales, axis_fn)
        return _transpose(forward, grad, input_size)
    return fn, backward


def _upsample_interp(nd, interp_axis):
    def axis_fn(align_corners):
        return lambda x, axis, o, s: interp_axis(x, axis, o, s, align_corners)

    def fn(x, output_size, align_corners, scale_factors=None):
        sizes, scales = _out_sizes(x, nd, output_size, scale_factors)
        return _resample(x, nd, sizes, scales, axis_fn(align_corners))

    def backward(grad, output_size, input_size, align_corners, *scales):
        scales = list(scales) + [None] * (nd - len(scales))
        forward = lambda x: _resample(x, nd, output_size, scales, axis_fn(align_corners))
        return _transpose(forward, grad, input_size)
    return fn, backward


for _nd in (1, 2, 3):
    for _name, _exact in ((f"upsample_nearest{_nd}d", False),
                          (f"_upsample_nearest_exact{_nd}d", True)):
        _fwd, _bwd = _upsample_nearest(_nd, _exact)
        lowering(getattr(aten, _name).vec)(_fwd)
        lowering(getattr(aten, f"{_name}_backward").default)(_bwd)
for _name, _nd in (("upsample_linear1d", 1), ("upsample_bilinear2d", 2),
                   ("upsample_trilinear3d", 3)):
    _fwd, _bwd = _upsample_interp(_nd, _linear_axis)
    lowering(getattr(aten, _name).vec)(_fwd)
    lowering(getattr(aten, f"{_name}_backward").default)(_bwd)


@lowering(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    # Lowered rather than left to PyTorch's decomposition so that the backward below is
    # the exact transpose of the forward, and the pair compiles in a fraction of the time.
    cubic = lambda x, axis, o, s: _cubic_axis(x, axis, o, s, align_corners)
    return _resample(x, 2, output_size, [scales_h, scales_w], cubic)


lowering(aten.upsample_bicubic2d_backward.default)(_upsample_interp(2, _cubic_axis)[1])


def _reflect(coord, twice_low, twice_high):
    """ATen's reflection of a source coordinate into [twice_low/2, twice_high/2]."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    dist = jnp.abs(coord - low)
    extra, flips = jnp.fmod(dist, span), jnp.floor(dist / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _clip(coord, size):
    """Clamp a source coordinate into the image. ATen's backward passes no gradient to a
    coordinate sitting exactly on the border; jnp.clip would pass half of it there."""
    inside = (coord > 0) & (coord < size - 1)
    return jnp.where(inside, coord, jnp.clip(jax.lax.stop_gradient(coord), 0, size - 1))


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Bilinear (0), nearest (1) or bicubic (2) sampling with zeros (0), border (1) or
    reflection (2) padding, as ATen's CPU kernel computes them."""
    n, c, h, w = x.shape

    def unnorm(coord, size):
        if align_corners:
            return (coord + 1) / 2 * (size - 1)
        return ((coord + 1) * size - 1) / 2

    def pad(coord, size):
        if padding_mode == 2:
            coord = (_reflect(coord, 0, 2 * (size - 1)) if align_corners
                     else _reflect(coord, -1, 2 * size - 1))
        return _clip(coord, size) if padding_mode in (1, 2) else coord
    gx, gy = unnorm(grid[..., 0], w), unnorm(grid[..., 1], h)
    batch = jnp.arange(n)[:, None, None]

    def taps(points):
        """Sum of weight * x over (iy, ix, weight) points. One gather for all of them:
        its transpose, the backward, is then one scatter, which XLA compiles in about
        half the time of one per tap."""
        iy, ix, weight = (jnp.stack(list(p)) for p in zip(*points))
        valid = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        v = x[batch, :, jnp.clip(iy, 0, h - 1), jnp.clip(ix, 0, w - 1)]  # k, n, oh, ow, c
        out = jnp.sum(jnp.where(valid[..., None], v, 0) * weight[..., None], axis=0)
        return jnp.moveaxis(out, -1, 1)
    if interpolation_mode == 2:
        # bicubic pads each of the 4x4 integer taps, not the sampling point
        x0, y0 = jnp.floor(gx), jnp.floor(gy)
        cx, cy = _cubic_coeffs(gx - x0), _cubic_coeffs(gy - y0)
        return taps([(pad(y0 - 1 + j, h).astype(jnp.int32), pad(x0 - 1 + i, w).astype(jnp.int32),
                      cx[i] * cy[j]) for j in range(4) for i in range(4)])
    gx, gy = pad(gx, w), pad(gy, h)
    if interpolation_mode == 1:
        return taps([(jnp.round(gy).astype(jnp.int32), jnp.round(gx).astype(jnp.int32),
                      jnp.ones_like(gx))])
    x0, y0 = jnp.floor(gx), jnp.floor(gy)
    wx, wy = gx - x0, gy - y0
    x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
    return taps([(y0, x0, (1 - wx) * (1 - wy)), (y0, x0 + 1, wx * (1 - wy)),
                 (y0 + 1, x0, (1 - wx) * wy), (y0 + 1, x0 + 1, wx * wy)])


@lowering(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Trilinear (0) or nearest (1) volume sampling, paddings as in `grid_sampler_2d`."""
    n, c, d, h, w = x.shape
    sizes = (w, h, d)  # grid's last dim holds (x, y, z)

    def coord(k):
        size, g = sizes[k], grid[..., k]
        g = (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
        if padding_mode == 2:
            g = _reflect(g, 0, 2 * (size - 1)) if align_corners else _reflect(g, -1, 2 * size - 1)
        return _clip(g, size) if padding_mode in (1, 2) else g
    gx, gy, gz = coord(0), coord(1), coord(2)
    batch = jnp.arange(n)[:, None, None, None]

    def at(iz, iy, ix):
        valid = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h) & (iz >= 0) & (iz < d)
        v = x[batch, :, jnp.clip(iz, 0, d - 1), jnp.clip(iy, 0, h - 1), jnp.clip(ix, 0, w - 1)]
        return jnp.where(valid[..., None], v, 0)
    if interpolation_mode == 1:
        r = lambda g: jnp.round(g).astype(jnp.int32)
        out = at(r(gz), r(gy), r(gx))
    else:
        x0, y0, z0 = jnp.floor(gx), jnp.floor(gy), jnp.floor(gz)
        fx, fy, fz = gx - x0, gy - y0, gz - z0
        x0, y0, z0 = x0.astype(jnp.int32), y0.astype(jnp.int32), z0.astype(jnp.int32)
        out = 0
        for dz in (0, 1):
            for dy in (0, 1):
                for dx in (0, 1):
                    weight = ((fx if dx else 1 - fx) * (fy if dy else 1 - fy)
                              * (fz if dz else 1 - fz))
                    out = out + at(z0 + dz, y0 + dy, x0 + dx) * weight[..., None]
    return jnp.moveaxis(out, -1, 1)


def _sampler_backward(forward):
    def backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
        """Gradients of input and grid: the VJP of the forward lowering. Nearest sampling
        gives the grid a zero gradient (rounding has none), as ATen does."""
        sample = lambda x, grid: forward(x, grid, interpolation_mode, padding_mode, align_corners)
        _, vjp = jax.vjp(sample, x, grid)
        grad_x, grad_grid = vjp(grad)
        return (grad_x if output_mask[0] else None, grad_grid if output_mask[1] else None)
    return backward


lowering(aten.grid_sampler_2d_backward.default)(_sampler_backward(grid_sampler_2d))
lowering(aten.grid_sampler_3d_backward.default)(_sampler_backward(grid_sampler_3d))


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


def _aa_weights(size, out, align_corners, scale):
    """(out, size) matrix of ATen's antialiased linear interpolation: a triangle filter
    stretched over the input pixels one output pixel covers when downsampling."""
    if align_corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale else size / out
    support = ratio if ratio >= 1 else 1.0
    invscale = 1.0 / ratio if ratio >= 1 else 1.0
    w = np.zeros((out, size), np.float64)
    for i in range(out):
        center = ratio * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), size)
        j = np.arange(lo, hi)
        taps = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) * invscale))
        total = taps.sum()
        w[i, lo:hi] = taps / total if total else taps
    return w


@lowering(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    h, w = x.shape[-2:]
    wh = jnp.asarray(_aa_weights(h, output_size[0], align_corners, scales_h), x.dtype)
    ww = jnp.asarray(_aa_weights(w, output_size[1], align_corners, scales_w), x.dtype)
    return jnp.einsum("...hw,oh,pw->...op", x, wh, ww)


@lowering(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(grad, output_size, input_size, align_corners,
                                    scales_h=None, scales_w=None):
    h, w = input_size[-2:]
    wh = jnp.asarray(_aa_weights(h, output_size[0], align_corners, scales_h), grad.dtype)
    ww = jnp.asarray(_aa_weights(w, output_size[1], align_corners, scales_w), grad.dtype)
    return jnp.einsum("...op,oh,pw->...hw", grad, wh, ww)
