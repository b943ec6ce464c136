"""Gradients returned packed: many small gradient outputs as one flat array per dtype,
which costs a program call less than one output each."""
import jax
import numpy as np


# Packing small gradients into one array saves the per-output cost of the step's call (a few
# microseconds each); packing copies every byte, which costs more once gradients average
# more than about this many bytes (docs/benchmarks.md gives the measurements).
PACK_MEAN_BYTES = 16 * 1024


def grad_layout(cells):
    """(flat array index, offset, shape) per gradient when gradients are returned packed,
    one flat array per dtype; None when there is nothing to gain (at most one gradient, or
    gradients large enough that the copy costs more than the outputs it saves)."""
    total = sum(int(np.prod(c.array.shape, dtype=np.int64)) * c.array.dtype.itemsize
                for c in cells)
    if len(cells) < 2 or total > PACK_MEAN_BYTES * len(cells):
        return None
    flats, sizes, layout = {}, [], []
    for cell in cells:
        dtype = cell.array.dtype
        if dtype not in flats:
            flats[dtype] = len(flats)
            sizes.append(0)
        f = flats[dtype]
        layout.append((f, sizes[f], tuple(cell.array.shape)))
        sizes[f] += int(np.prod(cell.array.shape, dtype=np.int64))
    return layout


def pack_grads(grads, layout):
    parts = {}
    for g, (f, _, _) in zip(grads, layout):
        parts.setdefault(f, []).append(g.reshape(-1))
    return [jax.numpy.concatenate(parts[f]) for f in sorted(parts)]
