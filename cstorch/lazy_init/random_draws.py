"""Random values of a recipe, drawn from JAX's PRNG in blocks of rows so that XLA's
working memory stays small; the blocks depend on the shape only, not the mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge import LOWERINGS, to_jax_dtype
from bridge.ops.random import key_stream

aten = torch.ops.aten


_SHAPE_ARG = {aten.uniform.default: 0, aten.normal_functional.default: 0, aten.bernoulli.p: 0,
              aten.rand_like.default: 0, aten.randn_like.default: 0, aten.rand.default: "size",
              aten.randn.default: "size", aten.randint.low: "size", aten.randint.default: "size",
              aten.normal.float_float: "size"}
# A large random tensor is drawn this many elements at a time: JAX's threefry on the CPU
# keeps temporaries of three times what one draw makes (768 MiB for a 256 MiB weight).
_DRAW_ELEMENTS = 1 << 22


def draw(op, args, kwargs, key, dtypes):
    """A random op's result. A large one is drawn in blocks of leading rows, each from
    its own key folded from `key`, in one loop: XLA's temporaries stay the size of a
    block. The blocks depend only on the shape, so the values do not depend on the
    mesh."""
    where = _SHAPE_ARG.get(op)
    if where is None or isinstance(dtypes, tuple):
        with key_stream(key):
            return LOWERINGS[op](*args, **kwargs)
    names = [a.name for a in op._schema.arguments]
    i = names.index("size") if where == "size" else where
    bound = list(args) + [kwargs.pop(n) for n in names[len(args):i + 1] if n in kwargs]
    shape = tuple(bound[i]) if where == "size" else tuple(bound[i].shape)
    numel = int(np.prod(shape)) if shape else 1
    if numel <= _DRAW_ELEMENTS or not shape:
        with key_stream(key):
            return LOWERINGS[op](*bound, **kwargs)
    per_row = numel // shape[0]
    target = max(1, _DRAW_ELEMENTS // max(per_row, 1))
    rows = _divisor_at_most(shape[0], target)
    block = (rows,) + shape[1:]
    if where == "size":
        bound[i] = list(block)
    else:
        bound[i] = jax.ShapeDtypeStruct(block, bound[i].dtype)
    dtype = to_jax_dtype(dtypes)

    def body(j, out):
        with key_stream(jax.random.fold_in(key, j)):
            part = LOWERINGS[op](*bound, **kwargs)
        return jax.lax.dynamic_update_slice(out, part.astype(dtype), (j * rows,) + (0,) * (len(shape) - 1))
    return jax.lax.fori_loop(0, shape[0] // rows, body, jnp.zeros(shape, dtype))


def _divisor_at_most(n, limit):
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
        d += 1
    return best
