"""`cerebras.pytorch.backends`: flags that control specific backends (only `csx` has any).

As in the reference, `cstorch.backends` is also the namespace object `backends`: its repr
shows every flag, and calling it with groups of flags sets them for a `with` block:
``with cstorch.backends(csx={"precision": {"optimization_level": 0}}): ...``.
"""
import contextlib
import sys
import types

from cstorch.backends import csx
from cstorch.backends.descriptors import (Descriptor, DeviceConfig, MicroBatchSize, POL,
                                          RetraceEveryIteration)

_GROUPS = ("precision", "performance", "debug", "cluster", "storage")


def _group_repr(group) -> str:
    if isinstance(group, csx.Storage):
        return f"(s3={_group_repr(group.s3)})"
    return "(" + ", ".join(f"{k}={getattr(group, k)!r}" for k in group._flags) + ")"


def _set_flags(group, values, path, saved):
    if not isinstance(values, dict):
        raise TypeError(f"cstorch.backends({path}=...) takes a dict of flags, got "
                        f"{type(values).__name__}")
    for name, value in values.items():
        if isinstance(value, dict) and isinstance(getattr(group, name, None), csx._FlagGroup):
            _set_flags(getattr(group, name), value, f"{path}.{name}", saved)
            continue
        if name not in group._flags and not isinstance(getattr(group, name, None), csx._FlagGroup):
            raise AttributeError(f"{path} has no flag {name!r}; known flags: "
                                 f"{', '.join(sorted(group._flags))}")
        saved.append((group, name, getattr(group, name)))
        setattr(group, name, value)


class _BackendsModule(types.ModuleType):
    """The type of this module: a module that is also the callable `backends` namespace."""

    def __call__(self, **backend_flags):
        """Set flags for a `with` block: `backends(csx={"performance": {"micro_batch_size":
        4}})`; every flag set returns to its former value on exit."""
        unknown = sorted(set(backend_flags) - {"csx"})
        if unknown:
            raise AttributeError(f"cstorch.backends has no backend {', '.join(unknown)}; "
                                 f"only csx has flags")
        return _flags_set(backend_flags.get("csx", {}))

    def __repr__(self):
        groups = ", ".join(f"{g}={_group_repr(getattr(csx, g))}" for g in _GROUPS)
        return f"backends(csx=({groups}))"


@contextlib.contextmanager
def _flags_set(values):
    saved = []
    try:
        for name, group_values in values.items():
            if name not in _GROUPS:
                raise AttributeError(f"cstorch.backends.csx has no group {name!r}; known "
                                     f"groups: {', '.join(_GROUPS)}")
            _set_flags(getattr(csx, name), group_values, f"csx.{name}", saved)
        yield sys.modules[__name__]
    finally:
        for group, name, value in reversed(saved):
            object.__setattr__(group, name, value)


sys.modules[__name__].__class__ = _BackendsModule
backends = sys.modules[__name__]

__all__ = ["csx", "backends", "Descriptor", "DeviceConfig", "MicroBatchSize", "POL",
           "RetraceEveryIteration"]
