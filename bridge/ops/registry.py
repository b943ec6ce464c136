"""The table of ATen lowerings: one JAX function per ATen op overload.

A lowering takes the node's arguments as the ATen schema gives them, with tensors
replaced by JAX arrays, and returns JAX arrays (a tuple for multi-output ops). The
interpreter casts each result to the dtype PyTorch recorded for the node, so lowerings
need not reproduce PyTorch's type promotion to the letter.
"""
import functools
from collections.abc import Callable

from torch._ops import OpOverload, OpOverloadPacket

LOWERINGS: dict[OpOverload, Callable] = {}


def _writes_out(op: OpOverload) -> bool:
    """Whether `op` is an out= variant (`add.out`, `max_pool2d_with_indices_backward.grad_input`)."""
    return any(a.is_out for a in op._schema.arguments)


def _describe(fn) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}{where}"


def lowering(*ops):
    """Register the decorated function as the lowering of each overload in `ops`.

    An `OpOverloadPacket` (``aten.add``) stands for its overloads except the out= variants
    (``add.out``): a lowering returns new arrays and cannot write into a caller's buffer,
    and a captured graph is functional, so it never holds one; naming an out= overload
    explicitly is refused. A second lowering for an overload is refused, naming both
    functions: which one a graph would get must not depend on import order.
    """
    def register(fn):
        for op in ops:
            if isinstance(op, OpOverloadPacket):
                overloads = [getattr(op, name) for name in op.overloads()]
                overloads = [o for o in overloads if not _writes_out(o)]
            elif _writes_out(op):
                raise ValueError(
                    f"{op} writes into an out= argument, which a lowering cannot serve; "
                    f"register {_describe(fn)} for the functional overload instead")
            else:
                overloads = [op]
            for overload in overloads:
                if overload in LOWERINGS:
                    raise ValueError(
                        f"{overload} already has a lowering, {_describe(LOWERINGS[overload])}; "
                        f"refusing a second one, {_describe(fn)}")
                LOWERINGS[overload] = fn
        return fn
    return register


def scalar_as_vector(fn):
    """Run `fn` on a 0-d first argument as a 1-element vector, and give back 0-d results.

    ATen treats a 0-d tensor as having one dimension of size 1 for `dim` arguments
    (dim 0 and -1 both name it); jax.numpy has no axis to name there.
    """

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
