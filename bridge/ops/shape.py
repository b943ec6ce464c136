"""Views, reshapes and layout ops. Graphs are functional, so every view is a copy here."""
import jax
import jax.numpy as jnp
import torch

from bridge.errors import DataDependentShapeError
from bridge.ops.registry import canonical_dim, lowering

aten = torch.ops.aten


def _reshape(x, size):
    return jnp.reshape(x, tuple(size))


lowering(aten.view.default, aten.view_copy.default, aten._unsafe_view.default,
         aten.reshape.default)(_reshape)


@lowering(aten.permute.default, aten.permute_copy.default)
def permute(x, dims):
    return jnp.transpose(x, tuple(dims))


@lowering(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1)


@lowering(aten.t.default, aten.t_copy.default)
def t(x):
    return x.T


@lowering(aten.expand.default, aten.expand_copy.default)
def expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowering(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(x):
    return jnp.squeeze(x)


@lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze_dims(x, dims):
    if x.ndim == 0:
        return x
    dims = [dims] if isinstance(dims, int) else dims
    return jnp.squeeze(x, tuple(d % x.ndim for d in dims if x.shape[d] == 1))


@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    dtype = jnp.result_type(*tensors)
    return jnp.concatenate([t.astype(dtype) for t in tensors], axis=dim)


@lowering(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim)


@lowering(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    n = x.shape[dim]
    return tuple(jax.lax.slice_in_dim(x, i, min(i + split_size, n), axis=dim)
                 for i in range(0, n, split_size)) if n else (x,)


@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, split_sizes, dim=0):
    out, start = [], 0
    for s in split_sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + s, axis=dim))
        start += s
    return tuple(out)


@lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    return tuple(jnp.moveaxis(x, dim, 0))


def _slice_bounds(n, start, end, step):
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    return max(0, min(start, n)), max(0, min(end, n)), step


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    start, end, step = _slice_bounds(x.shape[dim], start, end, step)
    end = max(start, end)
    return jax.lax.slice_in_dim(x, start, end, step, axis=dim)


@lowering(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    start, end, step = _slice_bounds(x.shape[dim], start, end, step)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x.at[tuple(index)].set(src)


@lowering(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@lowering(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(src)


@lowering(aten.narrow.default, aten.narrow_copy.default)
def narrow(x, dim, start, length):
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim)


@lowering(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, tuple(dims))


@lowering(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(dims))


@lowering(aten.repeat.default)
def repeat(x, repeats):
    lead = len(repeats) - x.ndim
    return jnp.tile(x.reshape((1,) * lead + x.shape), tuple(repeats))


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    config = [(lo, hi, 0) for lo, hi in widths]
    return jax.lax.pad(x, jnp.asarray(value, x.dtype), config)


@lowering(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1, dim2)


@lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    flat = x.reshape(-1)
    index = jnp.asarray(storage_offset or 0)
    for n, s in zip(size, stride):
        index = index[..., None] + jnp.arange(n) * s
    return flat[index]


@lowering(aten.as_strided_scatter.default, torch.ops.prims.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """`x` with the elements of its strided view (over `x`'s elements in order, as
    `as_strided` reads them) replaced by `src`; overlapping positions take the last write."""
    flat = x.reshape(-1)
    index = jnp.asarray(storage_offset or 0)
    for n, s in zip(size, stride):
        index = index[..., None] + jnp.arange(n) * s
    return flat.at[index.reshape(-1)].set(src.reshape(-1).astype(x.dtype)).reshape(x.shape)


@lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, dim, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    n = (x.shape[dim] - size) // step + 1
    starts = jnp.arange(n) * step
    windows = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(x, s, size, axis=dim))(starts)
    return jnp.moveaxis(jnp.moveaxis(windows, 0, dim), dim + 1, -1)


@lowering(aten.resize_.default, aten.resize.default)
def resize(x, size, memory_format=None):
    # The first numel(size) elements in order; PyTorch leaves any new elements
    # uninitialised, here they are zero.
    n = 1
    for d in size:
        n *= d
    flat = x.reshape(-1)
    flat = flat[:n] if flat.shape[0] >= n else jnp.pad(flat, (0, n - flat.shape[0]))
    return flat.reshape(tuple(size))


@lowering(aten.view_as_real_copy.default, aten.view_as_real.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowering(aten.view_as_complex_copy.default, aten.view_as_complex.default)
def view_as_complex(x):
    return jax.lax.complex(x[..., 0], x[..., 1])


# Lowered whole: PyTorch's decompositions build them by writing through a complex view,
# which functionalisation cannot replay.
@lowering(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return jax.lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(magnitude, angle):
    magnitude, angle = jnp.broadcast_arrays(magnitude, angle)
    return jax.lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(x, dim1), canonical_dim(x, dim2)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    n, m = moved.shape[-2:]
    k = src.shape[-1]
    rows = jnp.arange(k) + max(-offset, 0)
    cols = jnp.arange(k) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src)
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


def _pad(x, padding, mode):
    nd = len(padding) // 2
    pads = [(0, 0)] * (x.ndim - nd)
    for i in reversed(range(nd)):
        pads.append((padding[2 * i], padding[2 * i + 1]))
    if mode == "edge":
        # Replication reads the input at the clamped position, so a negative pad that
        # crops a whole side away still repeats the edge of what is left past it (crop
        # first, then pad, would pad an empty axis).
        for j, (lo, hi) in enumerate(pads):
            if lo or hi:
                idx = jnp.clip(jnp.arange(x.shape[j] + lo + hi) - lo, 0, x.shape[j] - 1)
                x = jnp.take(x, idx, axis=j)
        return x
    # negative padding crops
    crop = tuple(slice(max(-lo, 0), x.shape[j] - max(-hi, 0)) for j, (lo, hi) in enumerate(pads))
    x = x[crop]
    return jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in pads], mode=mode)


@lowering(aten._pad_circular.default)
def pad_circular(x, padding):
    return _pad(x, padding, "wrap")


for _n in (1, 2, 3):
    lowering(getattr(aten, f"reflection_pad{_n}d").default)(lambda x, p: _pad(x, p, "reflect"))
    lowering(getattr(aten, f"replication_pad{_n}d").default)(lambda x, p: _pad(x, p, "edge"))
    for _kind, _mode in (("reflection", "reflect"), ("replication", "edge")):
        def _bwd(grad, x, p, _mode=_mode):
            _, vjp = jax.vjp(lambda v: _pad(v, p, _mode), x)
            return vjp(grad)[0]
        lowering(getattr(aten, f"{_kind}_pad{_n}d_backward").default)(_bwd)


@lowering(aten.repeat_interleave.Tensor)
def repeat_interleave_indices(repeats, output_size=None):
    """`repeat_interleave(repeats)`: index i repeated repeats[i] times. Its length is the
    sum of `repeats`, a value, so only a call that states it (`output_size`) lowers."""
    if output_size is None:
        raise DataDependentShapeError(
            "repeat_interleave with tensor repeats has a length that depends on their values; "
            "pass output_size= to fix it")
    return jnp.repeat(jnp.arange(repeats.shape[0]), repeats, total_repeat_length=output_size)
