"""Backend flags as data descriptors: `Descriptor` holds a flag's value per instance,
checked by the subclass's `sanitize` on every assignment; `POL`, `MicroBatchSize`,
`RetraceEveryIteration` and `DeviceConfig` are the CSX flags of those names."""
import copy
import warnings
from typing import Any

from cstorch.backends import csx

# Neither `default` nor `default_factory` given.
_MISSING = object()


class Descriptor:
    """A flag on a class: reads give the instance's value (the default until set), writes
    go through `sanitize`, which checks a value and returns what is stored. Give
    `default` or `default_factory` (called once per instance, for mutable defaults)."""

    def __init__(self, *, default=_MISSING, default_factory=_MISSING):
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("give default or default_factory, not both")
        self.default, self.default_factory = default, default_factory
        self.name = None

    def __set_name__(self, owner, name):
        self.name = name

    def _initial(self):
        if self.default_factory is not _MISSING:
            return self.default_factory()
        if self.default is not _MISSING:
            return copy.deepcopy(self.default)
        raise AttributeError(f"flag {self.name!r} has no value and no default")

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        values = obj.__dict__.setdefault("_flag_values", {})
        if self.name not in values:
            values[self.name] = self.sanitize(self._initial())
        return values[self.name]

    def __set__(self, obj, value):
        obj.__dict__.setdefault("_flag_values", {})[self.name] = self.sanitize(value)

    def sanitize(self, value) -> Any:
        """Check `value` and return what to store (the value itself by default)."""
        return value


class POL(Descriptor):
    """The precision optimization level: an int in [0, 3) (`csx.precision`)."""

    def sanitize(self, value):
        csx._optimization_level(self.name or "optimization_level", value)
        return value


class MicroBatchSize(Descriptor):
    """The micro-batch size: None, "auto", "explore", a positive int, {"explore": {"min",
    "max"}}, or a dict of those per traced step function (`csx.performance`)."""

    def __set__(self, obj, value):
        self.set_attr(obj, value)

    def set_attr(self, obj, micro_batch_size):
        """Check `micro_batch_size` and store it on `obj`."""
        csx._micro_batch_size(self.name or "micro_batch_size", micro_batch_size)
        obj.__dict__.setdefault("_flag_values", {})[self.name] = micro_batch_size


class RetraceEveryIteration(Descriptor):
    """Whether every step is captured again: a bool (`csx.debug`)."""

    def sanitize(self, retrace_every_iteration):
        csx._bool(self.name or "retrace_every_iteration", retrace_every_iteration)
        return retrace_every_iteration


class DeviceConfig(Descriptor):
    """A device's configuration: None or a dict of settings, stored as a copy. There is
    no cluster device to configure here, so the settings are kept only."""

    def sanitize(self, value):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{self.name or 'device_config'} must be None or a dict, "
                            f"got {type(value).__name__}")
        if value:
            warnings.warn(f"{self.name or 'device_config'} has no effect here: there is no "
                          f"cluster device to configure", stacklevel=3)
        return dict(value) if value is not None else None


__all__ = ["Descriptor", "DeviceConfig", "MicroBatchSize", "POL", "RetraceEveryIteration"]
