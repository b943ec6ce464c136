"""`step_closure` and `checkpoint_closure`: Python that runs after a step, with its values."""
import functools

import torch
import torch.utils._pytree as pytree

from cstorch.backend import ltc_backend
from cstorch.run.capture_context import capturing
from cstorch.run.current import current_backend_impl
from cstorch.utils.data.executor import defer_checkpoint_closure, defer_step_closure

__all__ = ["step_closure", "checkpoint_closure", "StepClosureContext", "RepeatStepClosure",
           "current_backend_impl"]


class StepClosureContext:
    """Which step closures are running: `step_closure_stack` holds the names of the
    closures being run, innermost last (empty outside of any)."""

    step_closure_stack: list[str] = []

    @classmethod
    def wrap(cls, closure):
        """`closure`, registering its name on `step_closure_stack` while it runs."""
        name = getattr(closure, "__name__", type(closure).__name__)

        @functools.wraps(closure)
        def wrapped(*args, **kwargs):
            cls.step_closure_stack.append(name)
            try:
                return closure(*args, **kwargs)
            finally:
                cls.step_closure_stack.pop()
        return wrapped


class RepeatStepClosure:
    """A context manager in which the step closures a traced step records are run after
    every step, not only after the step that recorded them. Closures recorded here always
    run after every step (a traced step is captured once and its closures replayed), so
    this changes nothing; it is kept for code written for the real package."""

    active: bool = False

    def __init__(self, *args, **kwargs):
        self._was = False

    def __enter__(self):
        self._was, RepeatStepClosure.active = RepeatStepClosure.active, True
        return self

    def __exit__(self, *exc):
        RepeatStepClosure.active = self._was
        return False


def _receiving(closure):
    """What a traced step records for `closure`: the closure, which first hands each tensor
    it receives to the hooks of `cerebras.pytorch.backend.ltc_backend.
    register_after_tensor_to_cpu`, read to the host, when any hook is registered (the
    values a Cerebras system copies from the device for a closure). Without hooks it is
    the closure's call alone."""
    name = getattr(closure, "__qualname__", type(closure).__name__)

    @functools.wraps(closure)
    def run(*args, **kwargs):
        if ltc_backend.has_hooks():
            for i, leaf in enumerate(pytree.tree_leaves((args, kwargs))):
                if isinstance(leaf, torch.Tensor):
                    ltc_backend.tensor_to_cpu(leaf, f"{name}.{i}")
        return closure(*args, **kwargs)
    return run


def step_closure(closure):
    """Wrap `closure` so that it runs once the step is done, with that step's computed
    tensors: called inside a traced step or in a `DataExecutor` loop's body, it runs when
    the loop's body ends, in call order with the step's other closures; called with no
    executor running, right where the call is made."""
    running = StepClosureContext.wrap(closure)

    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(_receiving(running), args, kwargs, checkpoint_only=False)
            return None
        defer_step_closure(running, args, kwargs)
        return None
    return wrapper


def checkpoint_closure(closure):
    """Wrap `closure` so that it runs only on checkpoint steps (as the `DataExecutor`'s
    `checkpoint_steps` configures them), once the loop's body is done. It may be called on
    every step; a call between an executor's creation and its loop runs when the loop
    starts; a call with no executor raises a RuntimeError."""
    running = StepClosureContext.wrap(closure)

    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(_receiving(running), args, kwargs, checkpoint_only=True)
            return None
        defer_checkpoint_closure(running, args, kwargs)
        return None
    return wrapper
