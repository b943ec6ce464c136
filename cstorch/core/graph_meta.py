"""Annotations that travel with the ops of a captured step.

While a step is traced, `torch.fx.traceback.annotate` puts a dict into the `custom` meta
of every graph node recorded inside it. cstorch's scopes (`name_scope`, `pol`, the
annotations of `cstorch.core.annotation`) all write through `annotated` below, which keeps
one merged view of every scope that is open, so that nested scopes compose: the innermost
value of a key wins, and the dict handed to the gradient ops (`BACKWARD`) is merged too.

Outside a capture the annotations have no effect at all; they cost a dict update.
"""
import contextlib
import contextvars
from typing import Any

import torch.fx.traceback as fx_traceback

from bridge.capture import BACKWARD_ANNOTATIONS as BACKWARD
from bridge.lower import MATMUL_POLICY, NAME_SCOPE

# The key under which `cstorch.core.annotation` records its attributes on graph nodes,
# named as the Cerebras compiler names its dictionary of internal attributes.
CS_INTERNAL = "cs.internal"

__all__ = ["annotated", "BACKWARD", "MATMUL_POLICY", "NAME_SCOPE", "CS_INTERNAL",
           "node_annotations"]

# (forward annotations, backward annotations) of all scopes open in this context.
_open: contextvars.ContextVar[tuple] = contextvars.ContextVar(
    "cstorch_graph_annotations", default=({}, {}))


def _merge(base: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    if not extra:
        return base
    merged = dict(base)
    for key, value in extra.items():
        if key == CS_INTERNAL and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


@contextlib.contextmanager
def annotated(forward: dict[str, Any] | None = None,
              backward: dict[str, Any] | None = None):
    """Record `forward` on the graph nodes of the ops traced inside, and `backward` on the
    nodes of the ops that compute their gradients. `cs.internal` dicts merge key by key
    with those of enclosing scopes; other keys are replaced."""
    outer_fwd, outer_bwd = _open.get()
    fwd, bwd = _merge(outer_fwd, forward), _merge(outer_bwd, backward)
    token = _open.set((fwd, bwd))
    meta = dict(fwd)
    if bwd:
        meta[BACKWARD] = bwd
    try:
        with fx_traceback.annotate(meta):
            yield
    finally:
        _open.reset(token)


def node_annotations(node) -> dict[str, Any]:
    """The annotations an FX node of a captured step carries (empty if none)."""
    return dict(node.meta.get("custom") or {})
