"""`cerebras.pytorch.core.name_scope`: the names of a model's modules and scopes.

`add_debug_name` / `get_debug_name` give each module its dotted path from a root;
`ModuleNamesGenerator` gives module instances unique names by class; `name_scope` and
`set_debug_scope` name the ops traced inside a scope (`cstorch.core.scopes`); a
`ScopeName` is one scope's name, type and function.
"""
import weakref

import torch

from cstorch.core import scopes

__all__ = ["ModuleNamesGenerator", "ScopeName", "add_debug_name", "get_debug_name",
           "name_scope", "set_debug_scope"]

_ATTR = "_cstorch_debug_name"


class ScopeName:
    """The name of one scope: `scope_name`, what kind of scope it is (`scope_type`, for
    example "fwd" or "bwd") and the function it is about (`scope_func`). Its str is the
    name (empty when none)."""

    def __init__(self, scope_name=None, scope_type=None, scope_func=None):
        self.scope_name = scope_name
        self.scope_type = scope_type
        self.scope_func = scope_func

    def __str__(self):
        return self.scope_name or ""

    def __eq__(self, other):
        return isinstance(other, ScopeName) and (
            (self.scope_name, self.scope_type, self.scope_func)
            == (other.scope_name, other.scope_type, other.scope_func))

    def __hash__(self):
        return hash((self.scope_name, self.scope_type, self.scope_func))

    def __repr__(self):
        return (f"ScopeName(scope_name={self.scope_name!r}, scope_type={self.scope_type!r}, "
                f"scope_func={self.scope_func!r})")


class ModuleNamesGenerator:
    """Unique names for module instances: the first instance of a class seen is named by
    the class (``Linear``), later ones ``Linear_1``, ``Linear_2``...; an instance keeps
    its name. Used through its class methods (one registry per process)."""

    _instances: dict = {}

    @classmethod
    def get_or_create_instances_info(cls, module_cls) -> dict:
        """The registry of `module_cls`: ``{"count": instances named so far, "names":
        {instance: name}}`` (instances held weakly)."""
        info = cls._instances.get(module_cls)
        if info is None:
            info = cls._instances[module_cls] = {"count": 0,
                                                 "names": weakref.WeakKeyDictionary()}
        return info

    @classmethod
    def get_name(cls, module) -> str:
        """The unique name of `module`."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"get_name expects a torch.nn.Module, got {type(module).__name__}")
        info = cls.get_or_create_instances_info(type(module))
        name = info["names"].get(module)
        if name is None:
            n = info["count"]
            name = type(module).__name__ if n == 0 else f"{type(module).__name__}_{n}"
            info["names"][module] = name
            info["count"] = n + 1
        return name


def add_debug_name(module: torch.nn.Module, root_name: str | None = None) -> torch.nn.Module:
    """Name `module` and every module inside it by its path from `module`: the root is
    `root_name` ("model" when None), its submodules ``model.encoder``,
    ``model.encoder.layers.0`` and so on. `get_debug_name` returns the name; tools that
    dump or log per-module values use it as a stable key. Naming a module again (from
    another root) replaces its name. Returns `module`."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"add_debug_name expects a torch.nn.Module, got {type(module).__name__}")
    root_name = "model" if root_name is None else root_name
    for path, sub in module.named_modules(remove_duplicate=False):
        name = f"{root_name}.{path}" if path and root_name else (path or root_name)
        object.__setattr__(sub, _ATTR, name)
    return module


def get_debug_name(module: torch.nn.Module) -> str:
    """The name `add_debug_name` gave `module`; a module never named gets its class name."""
    name = getattr(module, _ATTR, None)
    return name if name is not None else type(module).__name__


def name_scope(name: str, raw: bool = False) -> scopes.name_scope:
    """``with name_scope("grad_norm"): ...`` names the ops traced inside (see
    `cstorch.core.scopes.name_scope`). A '/' in `name` is part of the one name unless
    `raw`, where the name is used as given and each '/' opens a level."""
    return scopes.name_scope(name, raw=raw)


def set_debug_scope(name) -> None:
    """Name the part of the run that follows: name scopes opened from now on nest under
    `name` (a str or `ScopeName`; None or "" ends it), and `current_name_scope()` starts
    with it."""
    scopes.set_debug_scope(None if name is None else str(name))
