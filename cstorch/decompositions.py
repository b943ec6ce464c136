"""`cstorch.register_decomposition`: a user's rule for computing an ATen op from others,
used when the traced steps of one kind of backend are captured."""
from collections.abc import Callable

import torch

from cstorch.backend.types import BackendType

_TABLES: dict[BackendType, dict] = {t: {} for t in BackendType}


def _overloads(op):
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    raise TypeError(f"register_decomposition expects an ATen op (torch.ops.aten.gelu or "
                    f"torch.ops.aten.gelu.default), got {op!r}")


def register_decomposition(op, device="CSX") -> Callable[[Callable], Callable]:
    """Decorate a function that computes `op` (an op overload, or a packet for all of its
    overloads) from other ops: steps captured on a backend of type `device` ("CSX",
    "CPU" or "GPU") use it in place of the op, taking the op's arguments. Steps already
    captured keep the program they were compiled to. Returns the function unchanged."""
    overloads = _overloads(op)
    table = _TABLES[BackendType.from_str(device)]

    def register(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"a decomposition must be callable, got {type(fn).__name__}")
        for overload in overloads:
            table[overload] = fn
        return fn

    return register


def table_for(backend_type) -> dict:
    """The decompositions registered for `backend_type` ({op overload: function})."""
    return dict(_TABLES[BackendType.from_str(backend_type)])


__all__ = ["register_decomposition"]
