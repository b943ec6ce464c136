"""`step_closure` and `checkpoint_closure`: Python that runs after a step, with its values."""
import functools

import torch
import torch.utils._pytree as pytree

from cstorch.tracing import capturing
from cstorch.utils.data.executor import defer_checkpoint_closure, defer_step_closure


def _receiving(closure):
    """What a traced step records for `closure`: the closure, which first hands each tensor
    it receives to the hooks of `cerebras.pytorch.backend.ltc_backend.
    register_after_tensor_to_cpu`, read to the host, when any hook is registered (the
    values a Cerebras system copies from the device for a closure). Without hooks it is
    the closure's call alone."""
    name = getattr(closure, "__qualname__", type(closure).__name__)

    @functools.wraps(closure)
    def run(*args, **kwargs):
        from cstorch.backend import ltc_backend
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
    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(_receiving(closure), args, kwargs, checkpoint_only=False)
            return None
        defer_step_closure(closure, args, kwargs)
        return None
    return wrapper


def checkpoint_closure(closure):
    """Wrap `closure` so that it runs only on checkpoint steps (as the `DataExecutor`'s
    `checkpoint_steps` configures them), once the loop's body is done. It may be called on
    every step; a call between an executor's creation and its loop runs when the loop
    starts; a call with no executor raises a RuntimeError."""
    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(_receiving(closure), args, kwargs, checkpoint_only=True)
            return None
        defer_checkpoint_closure(closure, args, kwargs)
        return None
    return wrapper
