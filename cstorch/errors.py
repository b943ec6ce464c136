"""The exception types this project raises itself.

Each subclasses the builtin exception a caller would have caught before it existed (and
that eager PyTorch or the reference raises in the same situation), so `except
RuntimeError` and the like keep working; `CstorchError` catches every one of them. The
errors of capturing and lowering a step come from `bridge` and are re-exported here.
Like the run core, this module imports nothing of `cstorch`.
"""
from bridge.errors import (CaptureError, DataDependentShapeError, DynamicShapeError,
                           IndexOutOfRangeError, LoweringError, MicroBatchError,
                           TensorValueReadError)

__all__ = ["CstorchError", "BackendError", "ConfigurationError", "StepRefusedError",
           "TorchOptimizerInStepError", "MissingStateError", "CaptureError",
           "DataDependentShapeError", "DynamicShapeError", "IndexOutOfRangeError",
           "LoweringError", "MicroBatchError", "TensorValueReadError"]


class CstorchError(Exception):
    """Base of the errors below that this project defines."""


class BackendError(CstorchError, RuntimeError):
    """No backend exists where one is needed, or a second one was asked for."""


class ConfigurationError(CstorchError, ValueError):
    """A backend parameter or flag has a value this project does not accept."""


class StepRefusedError(CstorchError, CaptureError):
    """A traced step does something its compiled program could not carry out as eager
    PyTorch would (assigning a float hyperparameter, registering state, a host-side
    scheduler or GradScaler step); the message says what to do instead."""


class TorchOptimizerInStepError(CstorchError, TypeError):
    """A `torch.optim` optimizer is stepped inside a traced step: use `cstorch.optim`'s."""


class MissingStateError(CstorchError, RuntimeError):
    """A step cannot run: state tensors have no value (a `drop_data` backend before a
    checkpoint was loaded)."""
