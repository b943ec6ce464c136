"""Debug names of modules: the dotted path of each module from a root."""
from typing import Optional

import torch

__all__ = ["add_debug_name", "get_debug_name"]

_ATTR = "_cstorch_debug_name"


def add_debug_name(module: torch.nn.Module, root_name: str = "model") -> torch.nn.Module:
    """Name `module` and every module inside it by its path from `module`: the root is
    `root_name`, its submodules ``model.encoder``, ``model.encoder.layers.0`` and so on.
    `get_debug_name` returns the name; tools that dump or log per-module values use it as
    a stable key. Naming a module again (from another root) replaces its name. Returns
    `module`."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"add_debug_name expects a torch.nn.Module, got {type(module).__name__}")
    for path, sub in module.named_modules(remove_duplicate=False):
        name = f"{root_name}.{path}" if path and root_name else (path or root_name)
        object.__setattr__(sub, _ATTR, name)
    return module


def get_debug_name(module: torch.nn.Module) -> Optional[str]:
    """The name `add_debug_name` gave `module`; a module never named gets its class name."""
    name = getattr(module, _ATTR, None)
    return name if name is not None else type(module).__name__
