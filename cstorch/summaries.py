"""`cstorch.summarize_scalar` and `cstorch.summarize_tensor`: values for TensorBoard.

Called inside a traced step, a summary is a step closure: after each step that fetches
outputs (see `DataExecutor(activation_steps=...)`) its value is written to the
`SummaryWriter` given to the running `DataExecutor`, at step ``writer.base_step +
executor.iteration`` (the zero-based step index), so with the writer's default
``base_step=1`` the first step's values are at step 1. Called outside a step, it is written
at once, at the same step.
"""
import warnings

import torch

from cstorch.utils.data.executor import running_executor
from cstorch.utils.step_closures import step_closure

_warned: set = set()


def _writer_and_step(kind, name):
    executor = running_executor()
    writer = executor.writer if executor is not None else None
    if writer is None:
        if (kind, name) not in _warned:
            _warned.add((kind, name))
            warnings.warn(
                f"summarize_{kind}({name!r}) is not written anywhere: pass "
                f"writer=cstorch.utils.tensorboard.SummaryWriter(log_dir) to the DataExecutor "
                f"that runs the step", stacklevel=4)
        return None, None
    # base_step is the step of the first step (1 by default), iteration counts from 0.
    return writer, getattr(writer, "base_step", 1) + executor.iteration


@step_closure
def _write_scalar(name, value):
    writer, step = _writer_and_step("scalar", name)
    if writer is not None:
        writer.add_scalar(name, float(value), global_step=step)


@step_closure
def _write_tensor(name, value):
    writer, step = _writer_and_step("tensor", name)
    if writer is None:
        return
    if not callable(getattr(writer, "add_tensor", None)):
        raise TypeError(f"summarize_tensor needs a writer with add_tensor, such as "
                        f"cstorch.utils.tensorboard.SummaryWriter; the executor's writer is a "
                        f"{type(writer).__name__}")
    writer.add_tensor(name, value.detach(), step)


def _check_name(fn, name):
    if not isinstance(name, str) or not name:
        raise TypeError(f"{fn} takes a non-empty str name first, got {name!r}")


def summarize_scalar(name: str, value) -> None:
    """Record a scalar (a one-element tensor or a number) for TensorBoard under `name`.

    Visible only when a `cstorch.utils.tensorboard.SummaryWriter` was passed to the
    `DataExecutor` running the step; otherwise a warning says it is not written.
    """
    _check_name("summarize_scalar", name)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"summarize_scalar({name!r}) got a tensor of shape "
                             f"{tuple(value.shape)}; use summarize_tensor for tensors, or "
                             f"reduce it to one value first")
        value = value.detach().reshape(())
    elif not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"summarize_scalar({name!r}) takes a one-element tensor or a number, "
                        f"got {type(value).__name__}")
    _write_scalar(name, value)


def summarize_tensor(name: str, value: torch.Tensor) -> None:
    """Record a whole tensor for TensorBoard under `name`, read back with
    `cstorch.utils.tensorboard.SummaryReader.read_tensor`.

    Visible only when a `cstorch.utils.tensorboard.SummaryWriter` was passed to the
    `DataExecutor` running the step; otherwise a warning says it is not written.
    """
    _check_name("summarize_tensor", name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"summarize_tensor({name!r}) takes a tensor, got {type(value).__name__}")
    _write_tensor(name, value.detach())
