"""`cerebras.pytorch.lib.cerebras_pytorch_lib`: attributes the Cerebras compiler reads.

On a Cerebras system these functions are native bindings that attach attributes to the
compiler's IR. Here there is no such IR: an attribute is recorded on the tensor itself,
readable with `get_attributes`, and has no effect on what is computed.
"""
from typing import Any

import torch

__all__ = ["set_attribute", "get_attributes"]

_ATTR = "_cstorch_attributes"


def set_attribute(tensor: torch.Tensor, name: str, value: Any) -> None:
    """Record compiler attribute `name` = `value` on `tensor` (for example
    ``set_attribute(x, "cs.internal", {"source_vars": ["layer0.out"]})``). Setting a dict
    under a name that already holds one merges them key by key; anything else replaces the
    old value. Values are not changed."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"set_attribute expects a tensor, got {type(tensor).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"an attribute name is a string, got {type(name).__name__}")
    attrs = dict(getattr(tensor, _ATTR, None) or {})
    old = attrs.get(name)
    attrs[name] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    setattr(tensor, _ATTR, attrs)


def get_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """The attributes `set_attribute` recorded on `tensor` (empty if none)."""
    return dict(getattr(tensor, _ATTR, None) or {})
