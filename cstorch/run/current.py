"""The current backend and data executor: one slot each, as the design allows one backend
per process and one running executor (an inner loop hands the slot back to the outer one
when it ends)."""
from typing import Any

from cstorch.errors import BackendError

_backend: Any | None = None
_executor: Any | None = None
# The executor made last and not yet iterated: checkpoint closures called before its loop
# wait for it.
_upcoming: Any | None = None


def backend() -> Any | None:
    """The current `cstorch.backend.Backend`, or None before one is made."""
    return _backend


def current_backend_impl(raise_exception: bool = True) -> Any | None:
    """The current backend. With none: a RuntimeError if `raise_exception` (the default),
    else None (Model Zoo's `current_backend_impl(raise_exception=False)`)."""
    if _backend is None and raise_exception:
        raise BackendError("no backend has been initialized; call cstorch.backend(\"CPU\") first")
    return _backend


def set_backend(instance) -> None:
    global _backend
    _backend = instance


def executor() -> Any | None:
    """The running `DataExecutor`, or None outside a data loop."""
    return _executor


def set_executor(instance) -> Any | None:
    """Make `instance` the running executor; returns the one it replaces."""
    global _executor
    outer, _executor = _executor, instance
    return outer


def upcoming_executor() -> Any | None:
    """The `DataExecutor` made last and not yet iterated, or None."""
    return _upcoming


def set_upcoming_executor(instance) -> None:
    global _upcoming
    _upcoming = instance
