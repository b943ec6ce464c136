"""Errors raised by bridge, each saying what failed and what to do about it."""


class LoweringError(NotImplementedError):
    """An ATen op in a captured graph has no JAX lowering."""

    def __init__(self, op, source: str | None = None):
        where = f"\nIt was produced by:\n{source}" if source else ""
        super().__init__(
            f"no JAX lowering for ATen op {op.name()} (overload '{op._overloadname}'){where}\n"
            "Register one with bridge.ops.lowering, or rewrite the model code that produces it.")
        self.op = op


class TensorValueReadError(RuntimeError):
    """A tensor's value was read while its step was being captured."""


class DataDependentShapeError(NotImplementedError):
    """An op's output shape depends on tensor values, which a compiled XLA program cannot have."""
