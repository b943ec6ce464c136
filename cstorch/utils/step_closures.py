"""`step_closure` and `checkpoint_closure`: Python that runs after a step, with its values."""
import functools

from cstorch.tracing import capturing
from cstorch.utils.data.executor import is_checkpoint_step


def step_closure(closure):
    """Wrap `closure` so that a call inside a traced step runs after every step, with that
    step's computed tensors; a call outside a traced step runs right where it is made."""
    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(closure, args, kwargs, checkpoint_only=False)
            return None
        return closure(*args, **kwargs)
    return wrapper


def checkpoint_closure(closure):
    """Wrap `closure` so that it runs only on checkpoint steps (as the `DataExecutor`'s
    `checkpoint_steps` configures them). It may be called on every step; outside a
    `DataExecutor` it runs whenever it is called."""
    @functools.wraps(closure)
    def wrapper(*args, **kwargs):
        ctx = capturing.get()
        if ctx is not None:
            ctx.record_closure(closure, args, kwargs, checkpoint_only=True)
            return None
        if is_checkpoint_step():
            return closure(*args, **kwargs)
        return None
    return wrapper
