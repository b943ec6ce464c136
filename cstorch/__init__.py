"""cstorch: the `cerebras.pytorch` API on JAX and XLA.

This module is a face: it re-exports the public names, which live in the modules below.
"""
import sys

import cstorch_torchvision
from cstorch import torch_compat
from cstorch import amp, backends, distributed, metrics, optim, utils
from cstorch import cirh, core, experimental, lib, nn, profiler
from cstorch import mesh
from cstorch import numpy, sparse
from cstorch.backend import backend, current_backend, current_torch_device, use_cs
from cstorch.compile import compile
from cstorch.core import (add_debug_name, current_pol, get_debug_name, make_constant, name_scope,
                          pol)
from cstorch.decompositions import register_decomposition
from cstorch.storage import full, full_like, ones, ones_like, zeros, zeros_like
from cstorch.storage import load, save
from cstorch.summaries import summarize_scalar, summarize_tensor
from cstorch.tracing import JaxStep, TracedStep
from cstorch.utils.data.executor import current_executor
from cstorch.utils.numpy import from_numpy, to_numpy
from cstorch.utils.step_closures import checkpoint_closure, step_closure
from cstorch.version import __version__ as __version__

# The reference's `cerebras.pytorch.nn.functional` has the package as an attribute; set
# here, since the module importing its own parent package would be an import cycle.
nn.functional.cstorch = sys.modules[__name__]

torch_compat.restore_treespec_replace()
cstorch_torchvision.declare_missing_torchvision_operators()

# True only while documentation is generated (never here); Model Zoo checks it to swap in
# stand-ins for classes that need a live cluster.
_generating_docs = False


def trace(step_fn):
    """Wrap a training or evaluation step for tracing.

    The first call captures everything the step does (forward, `loss.backward()`, gradient
    clipping, `optimizer.step()`, scheduler steps) as one graph, lowered to one JAX
    function and compiled by XLA; every later call with arguments of the same shapes runs
    only that executable. No tensor value may be read inside the step (no printing, no
    `.item()`, no Python conditionals on tensors): use a `step_closure` to read values.
    While the step is captured, `torch.compiler.is_compiling()` is true, so library code
    (transformers' masks, say) skips checks that would read values.
    """
    return TracedStep(step_fn)


__all__ = [
    "backend", "current_backend", "current_torch_device", "use_cs", "backends", "compile", "trace",
    "TracedStep", "JaxStep", "save", "load", "optim", "utils", "step_closure", "checkpoint_closure",
    "current_executor", "full", "full_like", "ones", "ones_like", "zeros", "zeros_like",
    "from_numpy", "to_numpy", "summarize_scalar", "summarize_tensor", "distributed",
    "amp", "metrics", "sparse", "cirh", "core", "experimental", "lib", "nn", "profiler",
    "mesh", "make_constant", "name_scope", "pol", "current_pol", "add_debug_name", "get_debug_name",
    "register_decomposition", "numpy",
]
