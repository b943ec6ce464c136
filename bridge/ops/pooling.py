"""Max and average pooling (backward ops are the forwards' VJPs)."""
import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _expand(v, nd, default=None):
    if v is None or len(v) == 0:
        v = default
    return list(v) * nd if len(v) == 1 else list(v)


def _pads(size, kernel, stride, padding, dilation, ceil_mode):
    """(lo, hi) padding per spatial dim, extended on the right as ceil_mode needs."""
    pads = []
    for n, k, s, p, d in zip(size, kernel, stride, padding, dilation):
        eff = d * (k - 1) + 1
        out = (n + 2 * p - eff) // s + 1
        if ceil_mode:
            out = -(-(n + 2 * p - eff) // s) + 1
            if (out - 1) * s >= n + p:
                out -= 1
        hi = (out - 1) * s + eff - n - p
        pads.append((p, max(hi, p)))
    return pads


def _window(x, kernel, stride, padding, dilation, ceil_mode):
    nd = len(kernel)
    lead = x.ndim - nd
    pads = _pads(x.shape[lead:], kernel, stride, padding, dilation, ceil_mode)
    return ((1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
            [(0, 0)] * lead + pads, (1,) * lead + tuple(dilation))


def _max_pool(x, kernel, stride, padding, dilation, ceil_mode):
    dims, strides, pads, dil = _window(x, kernel, stride, padding, dilation, ceil_mode)
    init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return jax.lax.reduce_window(x, np.array(init, x.dtype), jax.lax.max, dims, strides, pads,
                                 window_dilation=dil)


def _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    kernel = _expand(kernel_size, nd)
    stride = _expand(stride, nd, kernel)
    padding = _expand(padding, nd, [0])
    dilation = _expand(dilation, nd, [1])
    dims, strides, pads, dil = _window(x, kernel, stride, padding, dilation, ceil_mode)
    spatial = x.shape[x.ndim - nd:]
    flat = jnp.arange(int(np.prod(spatial)), dtype=jnp.int32).reshape(spatial)
    flat = jnp.broadcast_to(flat, x.shape)
    init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = (vb > va) | ((vb == va) & (ib < ia)) | jnp.isnan(vb)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    values, indices = jax.lax.reduce_window(
        (x, flat), (jnp.asarray(init, x.dtype), jnp.asarray(np.iinfo(np.int32).max, jnp.int32)),
        pick, dims, strides, pads, window_dilation=dil)
    return values, indices, (kernel, stride, padding, dilation)


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    values, indices, _ = _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 2)
    return values, indices


@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    values, indices, _ = _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 3)
    return values, indices


def _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, nd):
    return _route_to_indices(grad, x, indices, nd)


def _route_to_indices(grad, x, indices, nd):
    """Each output gradient added at the input position its index names (a flat position
    within its `nd`-dimensional plane), as PyTorch's max-pooling backwards do."""
    # sizes spelled out, not -1: a reshape cannot infer a dim next to a zero-size one
    planes = int(np.prod(x.shape[:x.ndim - nd]))
    spatial = int(np.prod(x.shape[x.ndim - nd:]))
    pooled = int(np.prod(grad.shape[grad.ndim - nd:]))
    g = grad.reshape(planes, pooled)
    idx = indices.reshape(planes, pooled).astype(jnp.int32)
    out = jax.vmap(lambda o, i, v: o.at[i].add(v))(jnp.zeros((planes, spatial), grad.dtype), idx, g)
    return out.reshape(x.shape)


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 3)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    kernel = _expand(kernel_size, nd)
    stride = _expand(stride, nd, kernel)
    padding = _expand(padding, nd, [0])
    dims, strides, pads, dil = _window(x, kernel, stride, padding, [1] * nd, ceil_mode)
    total = jax.lax.reduce_window(x, np.array(0, x.dtype), jax.lax.add, dims, strides, pads)
    if divisor_override:
        return total / divisor_override
    # Divisor per window: the window clipped to the padded input (count_include_pad)
    # or to the real input.
    lead = x.ndim - nd
    ones = jnp.ones(x.shape[lead:], x.dtype)
    if count_include_pad:
        ones = jnp.pad(ones, [(p, p) for p in padding], constant_values=1)
        extra = [(0, hi - lo) for lo, hi in pads[lead:]]
        count = jax.lax.reduce_window(ones, np.array(0, x.dtype), jax.lax.add, dims[lead:],
                                      strides[lead:], extra)
    else:
        count = jax.lax.reduce_window(ones, np.array(0, x.dtype), jax.lax.add, dims[lead:],
                                      strides[lead:], pads[lead:])
    return total / count


def _avg_pool_nd(nd):
    def forward(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override, nd)

    def backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
        _, vjp = jax.vjp(lambda v: forward(v, kernel_size, stride, padding, ceil_mode,
                                           count_include_pad, divisor_override), x)
        return vjp(grad)[0]
    return forward, backward


for _nd in (2, 3):
    _forward, _backward = _avg_pool_nd(_nd)
    lowering(getattr(aten, f"avg_pool{_nd}d").default)(_forward)
    lowering(getattr(aten, f"avg_pool{_nd}d_backward").default)(_backward)


@lowering(aten.avg_pool1d.default)
def avg_pool1d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


@lowering(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    h, w = x.shape[-2:]
    oh, ow = output_size
    if h % oh == 0 and w % ow == 0:
        return _avg_pool(x, [h // oh, w // ow], [h // oh, w // ow], [0], False, True, None, 2)
    rows = [x[..., (i * h) // oh: -(-((i + 1) * h) // oh), :] for i in range(oh)]
    out = [[r[..., (j * w) // ow: -(-((j + 1) * w) // ow)].mean(axis=(-2, -1)) for j in range(ow)]
           for r in rows]
    return jnp.stack([jnp.stack(r, axis=-1) for r in out], axis=-2)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    _, vjp = jax.vjp(lambda v: adaptive_avg_pool2d(v, grad.shape[-2:]), x)
    return vjp(grad)[0]


def _fractional_starts(sample, size, out, k):
    """ATen's pseudo-random window starts for one dim (Graham, fractional max-pooling)."""
    i = jnp.arange(out, dtype=sample.dtype)
    alpha = (size - k) / max(out - 1, 1)
    # ATen casts to an integer, which truncates: a given sample outside [0, 1) differs
    # from floor.
    starts = (jnp.trunc((i + sample) * alpha) - jnp.trunc(sample * alpha)).astype(jnp.int32)
    return starts.at[-1].set(size - k)


def _fractional_max_pool(x, kernel_size, output_size, samples):
    """Max over windows starting at `_fractional_starts`; samples (N, C, nd) hold, per
    plane, the draw for the last dim first (W, then H, as ATen reads them) in 2-d and
    (T, H, W) in 3-d."""
    nd = len(kernel_size)
    batched = x.ndim == nd + 2
    if not batched:
        x, samples = x[None], samples.reshape((1,) + samples.shape[-2:])
    spatial = x.shape[2:]
    order = [1, 0] if nd == 2 else [0, 1, 2]  # which sample entry drives each spatial dim

    def plane(p, s):
        idx = []
        for d in range(nd):
            starts = _fractional_starts(s[order[d]], spatial[d], output_size[d], kernel_size[d])
            idx.append(starts[:, None] + jnp.arange(kernel_size[d]))  # (out_d, k_d)
        # gather the (out_0, k_0, out_1, k_1, ...) block of windows
        shape = []
        for d in range(nd):
            shape += [output_size[d], kernel_size[d]]
        gathered_idx = []
        for d in range(nd):
            view = [1] * (2 * nd)
            view[2 * d], view[2 * d + 1] = output_size[d], kernel_size[d]
            gathered_idx.append(jnp.broadcast_to(idx[d].reshape(view), shape))
        vals = p[tuple(gathered_idx)]
        lin = gathered_idx[0]
        for d in range(1, nd):
            lin = lin * spatial[d] + gathered_idx[d]
        perm = list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2))
        vals = jnp.transpose(vals, perm).reshape(tuple(output_size) + (-1,))
        lin = jnp.transpose(lin, perm).reshape(tuple(output_size) + (-1,))
        # NaN wins, then the first maximum, as ATen's scan keeps it
        arg = jnp.argmax(jnp.where(jnp.isnan(vals), jnp.inf, vals), axis=-1)
        out = jnp.take_along_axis(vals, arg[..., None], -1)[..., 0]
        return out, jnp.take_along_axis(lin, arg[..., None], -1)[..., 0]
    out, ind = jax.vmap(jax.vmap(plane))(x, samples.astype(x.dtype))
    if not batched:
        out, ind = out[0], ind[0]
    return out, ind


@lowering(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def fractional_max_pool(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, list(kernel_size), list(output_size), random_samples)


@lowering(aten.fractional_max_pool2d_backward.default, aten.fractional_max_pool3d_backward.default)
def fractional_max_pool_backward(grad, x, kernel_size, output_size, indices):
    return _route_to_indices(grad, x, indices, len(kernel_size))


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


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _route_to_indices(grad, x, indices, 2)


# Its own lowering: the number of pooled dims cannot be told from the shapes (a 3-d pool
# whose output depth equals the input depth looks like a 2-d pool of a 4-d batch).
@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _route_to_indices(grad, x, indices, 3)


@lowering(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(x, output_size):
    return _adaptive(x, list(output_size), lambda v, a: jnp.mean(v, axis=a))
