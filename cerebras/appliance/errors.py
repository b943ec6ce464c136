"""Exceptions that programs written for a Cerebras appliance catch by type.

Model Zoo's trainer tells failures apart with `isinstance` in this order: compilation,
cancelled job, unknown, NaN, deadlock. The classes are therefore siblings under
`ApplianceError` (no one is a subclass of another), so each failure matches exactly one
branch. Here, `ApplianceNanError` is raised by Model Zoo's own loss and loss-scale checks;
the others describe failures of a Cerebras cluster and are never raised by this project,
but can be raised and caught by user code as on a Cerebras system.

All take a message as their first argument and pickle with it, as Model Zoo sends them
between processes.
"""


class ApplianceError(Exception):
    """Base class of the errors below."""


class ApplianceCompilationError(ApplianceError):
    """The program could not be compiled for the target system. Retrying does not help."""


class ApplianceNanError(ApplianceError):
    """A NaN or Inf appeared in a value that training cannot continue from (the loss, or
    gradients that dynamic loss scaling cannot recover)."""


class ApplianceDeadlockError(ApplianceError):
    """The run stopped making progress (on a Cerebras system: the appliance deadlocked)."""


class ApplianceUnknownError(ApplianceError):
    """A run failed for a reason the appliance could not classify."""


class ClusterJobCancelledByCsctl(ApplianceError):
    """The cluster job was cancelled by its operator (`csctl cancel job`). Not retried."""


__all__ = ["ApplianceError", "ApplianceCompilationError", "ApplianceNanError",
           "ApplianceDeadlockError", "ApplianceUnknownError", "ClusterJobCancelledByCsctl"]
