"""The table of ATen lowerings: one JAX function per ATen op overload.

A lowering takes the node's arguments as the ATen schema gives them, with tensors
replaced by JAX arrays, and returns JAX arrays (a tuple for multi-output ops). The
interpreter casts each result to the dtype PyTorch recorded for the node, so lowerings
need not reproduce PyTorch's type promotion to the letter.
"""
from typing import Callable

from torch._ops import OpOverload, OpOverloadPacket

LOWERINGS: dict[OpOverload, Callable] = {}


def lowering(*ops):
    """Register the decorated function as the lowering of each overload in `ops`.

    An `OpOverloadPacket` (``aten.add``) registers all of its overloads not yet taken.
    """
    def register(fn):
        for op in ops:
            if isinstance(op, OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn
    return register


def scalar_as_vector(fn):
    """Run `fn` on a 0-d first argument as a 1-element vector, and give back 0-d results.

    ATen treats a 0-d tensor as having one dimension of size 1 for `dim` arguments
    (dim 0 and -1 both name it); jax.numpy has no axis to name there.
    """
    import functools

    @functools.wraps(fn)
    def wrapped(x, *args, **kwargs):
        if getattr(x, "ndim", None) != 0:
            return fn(x, *args, **kwargs)
        out = fn(x.reshape(1), *args, **kwargs)
        squeeze = lambda o: o.reshape(()) if getattr(o, "shape", None) == (1,) else o
        return tuple(squeeze(o) for o in out) if isinstance(out, (tuple, list)) else squeeze(out)
    return wrapped


def canonical_dim(x, dim):
    """`dim` as a non-negative axis of `x`; PyTorch lets 0-d tensors take dim 0 or -1."""
    return dim % x.ndim if x.ndim else 0
