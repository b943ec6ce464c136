"""The capture in progress: whether a traced step is running on stand-ins now, and what
the step asked for while it ran (step closures to call with its results)."""
import contextvars
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree

# The capture in progress, if any: step closures called during it are recorded here.
capturing = contextvars.ContextVar("cstorch_capture", default=None)


def is_capturing() -> bool:
    """Whether a `@cstorch.trace` step is being captured now."""
    return capturing.get() is not None


@dataclass
class ClosureCall:
    fn: Callable
    spec: Any                  # treespec of (args, kwargs)
    leaves: list               # leaves, tensors replaced by None
    tensor_positions: list     # leaf positions that hold step outputs
    checkpoint_only: bool


@dataclass
class CaptureContext:
    closures: list = field(default_factory=list)
    closure_tensors: list = field(default_factory=list)

    def record_closure(self, fn, args, kwargs, checkpoint_only):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        # The values at the call, as eager code would read them then: a tensor written in
        # place later in the step (the learning rate a scheduler steps) is not seen.
        self.closure_tensors.extend(leaves[i].detach().clone() for i in positions)
        kept = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self.closures.append(ClosureCall(fn, spec, kept, positions, checkpoint_only))


class UnregisteredModule(Exception):
    """Raised inside a capture by a module with real weights that no `cstorch.compile`
    covered: the capture stops, registers it and starts again."""

    def __init__(self, module):
        self.module = module
