"""Hooks on device values as they are copied to the host.

`register_after_tensor_to_cpu(hook)` adds `hook(tensor, name)`, called with each tensor a
step hands to a step closure, copied to the host, before the closure runs: on a Cerebras
system that is when the value arrives from the appliance, and Model Zoo's profiler times
batches by it. Here a traced step's closures receive the step's values as device tensors,
and with a hook registered each one is read to the host first (without hooks nothing is
read early). `tensor` is a read-only host tensor; `name` names the closure and argument
(`"<closure qualname>.<position>"`). The hook's return value is ignored. Values read
elsewhere (printing a step's returned loss, say) reach no hook.

The module keeps the real package's name (its lazy-tensor backend) so imports resolve.
"""
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.utils.hooks import RemovableHandle

_hooks: "OrderedDict[int, Callable]" = OrderedDict()


def register_after_tensor_to_cpu(hook: Callable[[torch.Tensor, str], None]) -> RemovableHandle:
    """Call `hook(tensor, name)` for every step-closure tensor copied to the host, until
    the returned handle's `remove()`."""
    if not callable(hook):
        raise TypeError(f"register_after_tensor_to_cpu takes a callable hook(tensor, name), "
                        f"got {type(hook).__name__}")
    handle = RemovableHandle(_hooks)
    _hooks[handle.id] = hook
    return handle


def has_hooks() -> bool:
    return bool(_hooks)


def tensor_to_cpu(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """The host value of `tensor` (read-only), after calling every registered hook."""
    read = getattr(tensor, "host_view", None)
    host = read() if callable(read) else tensor.detach().cpu()
    for hook in list(_hooks.values()):
        hook(host, name)
    return host


__all__ = ["register_after_tensor_to_cpu"]
