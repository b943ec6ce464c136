"""`cerebras.pytorch.experimental.listener`: look at tensors as a step is traced.

A hook registered here is called while a `cstorch.trace` step is captured, once for
every tensor a module's forward returns, with that tensor and a name:
``<module name>`` for a single tensor output, ``<module name>.<i>`` or
``<module name>.<key>`` for the tensors of a tuple or dict output. A module's name is its
`cstorch.add_debug_name` name if it has one, else its path in the compiled model
(``model.encoder.layers.0``), else its class name.

The hook runs inside the traced step: what it computes becomes part of the step, and
values it wants to read go through step closures or summaries (`summarize_scalar`,
`summarize_tensor`), as anywhere in a step. Outside a capture hooks are not called.
"""
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.utils.hooks import RemovableHandle

from cstorch.core.name_scope import _ATTR as DEBUG_NAME
from cstorch.run import current
from cstorch.run.capture_context import capturing
from cstorch.utils.nest import visit_torch_tensors

__all__ = ["register_traced_tensor_hook"]

TracedTensorHook = Callable[[torch.Tensor, str], None]

_hooks: "OrderedDict[int, TracedTensorHook]" = OrderedDict()
_lock = threading.Lock()
_module_hook: RemovableHandle | None = None
_paths: dict[int, tuple] = {}    # id(capture context) -> (module id -> path)


def register_traced_tensor_hook(hook: TracedTensorHook) -> RemovableHandle:
    """Call ``hook(tensor, name)`` for each tensor module forwards return while a step is
    traced. Returns a handle whose `remove()` unregisters it."""
    global _module_hook
    if not callable(hook):
        raise TypeError(f"register_traced_tensor_hook expects a callable, got {type(hook).__name__}")
    handle = RemovableHandle(_hooks)
    with _lock:
        _hooks[handle.id] = hook
        if _module_hook is None:
            _module_hook = torch.nn.modules.module.register_module_forward_hook(_on_forward)
    return handle


def _module_path(module: torch.nn.Module, ctx) -> str:
    name = getattr(module, DEBUG_NAME, None)
    if name is not None:
        return name
    key = id(ctx)
    if key not in _paths:
        _paths.clear()     # one capture at a time keeps its map
        backend = current.backend()
        roots = backend.modules if backend is not None else []
        paths = {}
        for i, root in enumerate(roots):
            prefix = "model" if len(roots) == 1 else f"model{i}"
            for path, sub in root.named_modules():
                paths.setdefault(id(sub), f"{prefix}.{path}" if path else prefix)
        _paths[key] = paths
    return _paths[key].get(id(module), type(module).__name__)


def _on_forward(module, args, output):
    global _module_hook
    if not _hooks:
        with _lock:
            if not _hooks and _module_hook is not None:
                _module_hook.remove()
                _module_hook = None
        return None
    ctx = capturing.get()
    if ctx is None:
        return None
    name = _module_path(module, ctx)
    for scope, tensor in visit_torch_tensors(output):
        full = ".".join([name] + scope)
        for hook in list(_hooks.values()):
            hook(tensor, full)
    return None
