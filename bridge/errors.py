"""Errors raised by bridge, each saying what failed and what to do about it."""

# Key in `node.meta["custom"]` of the graph nodes a backward pass recorded: the `seq_nr`
# of the forward op they differentiate, whose stack trace the node then carries.

GRADIENT_OF = "bridge_gradient_of"


class LoweringError(NotImplementedError):
    """An ATen op in a captured graph has no JAX lowering."""

    def __init__(self, op, source: str | None = None, gradient: bool = False):
        if source and gradient:
            # A backward op's own frame is only the `backward()` call; the forward op it
            # differentiates is the line the user can change.
            where = f"\nIt computes the gradient of the forward op at:\n{source}"
        else:
            where = f"\nIt was produced by:\n{source}" if source else ""
        super().__init__(
            f"no JAX lowering for ATen op {op.name()} (overload '{op._overloadname}'){where}\n"
            "Register one with bridge.ops.lowering, or rewrite the model code that produces it.")
        self.op = op


class CaptureError(RuntimeError):
    """The step does something a compiled program cannot do; the message says where."""


class TensorValueReadError(CaptureError):
    """A tensor's value was read while its step was being captured."""


class DataDependentShapeError(CaptureError, NotImplementedError):
    """An op's output shape depends on tensor values, which a compiled XLA program cannot have."""


class IndexOutOfRangeError(IndexError, RuntimeError):
    """A step was given an index out of its tensor's range (a class target, an embedding
    id, a gather index), which eager PyTorch refuses with an IndexError or a
    RuntimeError: this is both."""


class DynamicShapeError(ValueError):
    """The exported program has a symbolic (dynamic) dimension, which bridge does not lower."""


class MicroBatchError(ValueError):
    """A step that cannot be split into micro-batches as written."""
