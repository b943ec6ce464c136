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
