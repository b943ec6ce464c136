"""Histograms and segment reductions: values sorted into a static number of bins."""
import jax
import jax.numpy as jnp
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


def _histogram(x, edges, weight, density):
    x = x.reshape(-1)
    bins = edges.shape[0] - 1
    lo, hi = edges[0], edges[-1]
    # Bin i holds [edges[i], edges[i+1]), the last bin also its right edge, as in ATen.
    pos = jnp.clip(jnp.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    inside = (x >= lo) & (x <= hi)
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((bins,), x.dtype).at[pos].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


@lowering(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = (jnp.asarray(v, x.dtype) for v in range)
    elif x.size:
        lo, hi = jnp.min(x), jnp.max(x)
    else:  # ATen's range for no data
        lo, hi = jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype)
    # ATen widens an empty range to [lo - 0.5, hi + 0.5]; its edges are a linspace.
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    edges = jnp.linspace(lo, hi, bins + 1, dtype=x.dtype)
    return _histogram(x, edges, weight, density)


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, weight=None, density=False):
    return _histogram(x, bins.astype(x.dtype), weight, density)


_SEGMENT_INIT = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -jnp.inf, "min": jnp.inf}


def _segment_1d(data, lengths, reduce, initial):
    """`data` (N, ...) reduced over consecutive segments of `lengths` (S,) along dim 0."""
    n, s = data.shape[0], lengths.shape[0]
    ends = jnp.cumsum(lengths)
    seg = jnp.searchsorted(ends, jnp.arange(n), side="right")  # == s past the last end
    start = jnp.asarray(_SEGMENT_INIT[reduce] if initial is None else initial, data.dtype)
    out = jnp.full((s + 1,) + data.shape[1:], start, data.dtype)
    at = out.at[seg]
    out = {"sum": at.add, "mean": at.add, "prod": at.multiply, "max": at.max,
           "min": at.min}[reduce](data)[:s]
    if reduce == "mean":
        count = lengths.reshape((s,) + (1,) * (data.ndim - 1)).astype(data.dtype)
        # ATen's mean of an empty segment is the initial value, or NaN without one.
        out = jnp.where(count > 0, out / jnp.where(count > 0, count, 1),
                        jnp.nan if initial is None else start)
    elif initial is None and reduce in ("max", "min"):
        pass  # an empty segment keeps -inf / +inf, as ATen's does
    return out


@lowering(aten.segment_reduce.default)
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    if lengths is None:
        lengths = jnp.diff(offsets, axis=-1)
    axis = axis % data.ndim
    batch = lengths.ndim - 1  # lengths carries the dims before `axis`
    moved = jnp.moveaxis(data, axis, batch)
    fn = lambda d, l: _segment_1d(d, l, reduce, initial)
    for _ in range(batch):
        fn = jax.vmap(fn)
    return jnp.moveaxis(fn(moved, lengths), batch, axis)


def _segment_1d_backward(grad, output, data, lengths, start, reduce, initial):
    """ATen's gradient of `_segment_1d` for `data` (N, ...), segments of `lengths` (S,)
    laid end to end from position `start` (offsets[0]; 0 for lengths). Elements outside
    every segment get 0. max/min: the gradient reaches every element equal to the result
    (or NaN); where two or more do, each positive share is divided by their count, and a
    negative one is not (ATen's CPU kernel does exactly this). prod: grad * result / x,
    and for a zero or NaN x the product of the segment's other elements times `initial`."""
    n, s = data.shape[0], lengths.shape[0]
    if s == 0 or n == 0:
        return jnp.zeros_like(data)
    pos = jnp.arange(n)
    seg = jnp.searchsorted(start + jnp.cumsum(lengths), pos, side="right")
    inside = (seg < s) & (pos >= start)
    seg = jnp.where(inside, seg, s)  # row s of a per-segment total collects the outsiders
    index = jnp.minimum(seg, s - 1)
    g, out = grad[index], output[index]
    column = (n,) + (1,) * (data.ndim - 1)

    def per_segment(values):  # each element's segment total of `values`
        totals = jnp.zeros((s + 1,) + data.shape[1:], values.dtype).at[seg].add(values)
        return totals[seg]

    if reduce == "sum":
        result = g
    elif reduce == "mean":
        result = g / lengths[index].astype(data.dtype).reshape(column)
    elif reduce in ("max", "min"):
        hit = jnp.isnan(data) | (data == out)
        count = per_segment(hit.astype(jnp.int32))
        result = jnp.where(hit, g, 0)
        result = jnp.where((count >= 2) & (result > 0), result / count, result)
    elif reduce == "prod":
        is_nan, is_zero = jnp.isnan(data), data == 0
        special = is_nan | is_zero
        # the product of the segment's other elements: those neither zero nor NaN, then
        # zeroed (or NaN) by any other zero and made NaN by any other NaN
        rest = jnp.ones((s + 1,) + data.shape[1:], data.dtype).at[seg].multiply(
            jnp.where(special, 1, data))[seg]
        other_nans = per_segment(is_nan.astype(jnp.int32)) - is_nan
        other_zeros = per_segment(is_zero.astype(jnp.int32)) - is_zero
        first = jnp.asarray(1 if initial is None else initial, data.dtype)
        others = first * rest
        others = jnp.where(other_zeros > 0, others * 0, others)  # inf * 0 is NaN, as in ATen
        others = jnp.where(other_nans > 0, jnp.nan, others)
        result = jnp.where(special, g * others, g * out / jnp.where(special, 1, data))
    else:
        raise NotImplementedError(f"_segment_reduce_backward with reduce={reduce!r}")
    return jnp.where(inside.reshape(column), result, 0).astype(data.dtype)


@lowering(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0,
                            initial=None):
    if lengths is None:
        lengths, start = jnp.diff(offsets, axis=-1), offsets[..., 0]
    else:
        start = jnp.zeros(lengths.shape[:-1], lengths.dtype)
    axis = axis % data.ndim
    batch = lengths.ndim - 1  # lengths carries the dims before `axis`
    move = lambda a: jnp.moveaxis(a, axis, batch)
    fn = lambda g, o, d, l, b: _segment_1d_backward(g, o, d, l, b, reduce, initial)
    for _ in range(batch):
        fn = jax.vmap(fn)
    return jnp.moveaxis(fn(move(grad), move(output), move(data), lengths, start), batch, axis)


def _dd_edges(x, bins, range):
    """Per-dim bin edges of `histogramdd` over the last dim's D coordinates."""
    pts = x.reshape(-1, x.shape[-1])
    edges = []
    for d, n in enumerate(bins):
        if range is not None:
            lo, hi = (jnp.asarray(v, x.dtype) for v in range[2 * d:2 * d + 2])
        elif pts.shape[0]:
            lo, hi = jnp.min(pts[:, d]), jnp.max(pts[:, d])
        else:
            lo, hi = jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype)
        same = lo == hi
        lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
        edges.append(jnp.linspace(lo, hi, n + 1, dtype=x.dtype))
    return edges


def _dd_counts(x, edges, weight, density):
    pts = x.reshape(-1, x.shape[-1])
    inside = jnp.ones(pts.shape[0], bool)
    pos = []
    for d, e in enumerate(edges):
        v = pts[:, d]
        n = e.shape[0] - 1
        pos.append(jnp.clip(jnp.searchsorted(e, v, side="right") - 1, 0, n - 1))
        inside = inside & (v >= e[0]) & (v <= e[-1])
    w = jnp.ones(pts.shape[0], x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    shape = tuple(e.shape[0] - 1 for e in edges)
    hist = jnp.zeros(shape, x.dtype).at[tuple(pos)].add(jnp.where(inside, w, 0))
    if density:
        volume = jnp.ones(shape, x.dtype)
        for d, e in enumerate(edges):
            view = [1] * len(edges)
            view[d] = -1
            volume = volume * jnp.diff(e).reshape(view)
        hist = hist / (jnp.sum(hist) * volume)
    return hist


@lowering(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, range=None, weight=None, density=False):
    return _dd_edges(x, bins, range)


@lowering(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, range=None, weight=None, density=False):
    return _dd_counts(x, _dd_edges(x, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, weight=None, density=False):
    return _dd_counts(x, [b.astype(x.dtype) for b in bins], weight, density)


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
