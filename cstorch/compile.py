"""`cstorch.compile(model)`: hand a module's state to the backend."""
import sys
import time

import torch
from tqdm.auto import tqdm

from cstorch.amp import autocast
from cstorch.backend import (Backend, BackendType, backend as make_backend,
                             current_backend_impl, current_or_cpu_backend)
from cstorch.notices import inform


class CompiledModule:
    """What `cstorch.compile` returns: calling it runs the module's forward pass.

    Public attributes and methods (`parameters()`, `state_dict()`, `train()`, ...) are the
    module's own; private ones and property accessors of the module are not exposed.
    """

    def __init__(self, module: torch.nn.Module, backend: Backend):
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "backend", backend)

    def __call__(self, *args, **kwargs):
        if self.backend.params.get("mixed_precision"):
            with autocast():
                return self.module(*args, **kwargs)
        return self.module(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(f"compiled module has no attribute {name!r}; private attributes "
                                 "of the original module are not exposed")
        return getattr(self.module, name)

    def __setattr__(self, name, value):
        setattr(self.module, name, value)

    def __repr__(self):
        return f"CompiledModule({self.module!r})"


def compile(model: torch.nn.Module, backend: str | Backend | None = None) -> CompiledModule:
    """Prepare `model` for tracing: from here on the backend owns its parameters and
    buffers. Initialise parameters before calling this.

    The module's parameters and buffers are replaced by device tensors of the same values
    (still `torch.nn.Parameter`s): every later read or write of them, through `.data`,
    in-place ops, `load_state_dict` or `nn.init`, reaches the device value. Tensors taken
    from the module before this call are the old, host ones.

    `backend` is a Backend, a backend type ("CPU", "CSX", "GPU": the current backend if it
    has that type, else a new one, refused while another exists), or None for the current
    backend (a CPU backend is created if there is none). A module without a `device`
    attribute gets one: the backend's `torch_device`. A CSX backend with
    `log_initialization` (the default) shows the tensors being placed on a terminal.
    """
    if isinstance(model, CompiledModule):
        raise TypeError("this module has already been compiled; pass the module itself, once")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"cstorch.compile expects a torch.nn.Module, got {type(model).__name__}")
    if isinstance(backend, str):
        current = current_backend_impl(raise_exception=False)
        if current is not None and current.backend_type == BackendType.from_str(backend):
            backend = current
        else:   # a backend of another type is refused while one exists
            backend = make_backend(backend)
    elif backend is None:
        backend = current_or_cpu_backend()
    elif not isinstance(backend, Backend):
        raise TypeError(f"backend must be a cstorch backend, a backend type or None, got {backend!r}")
    if any(m is model for m in backend.modules):
        raise RuntimeError("this module has already been compiled on this backend")
    backend.modules.append(model)
    if not hasattr(model, "device"):
        # Where tensors that meet the module's state belong (Model Zoo's norm callbacks
        # build theirs with `.to(model.device)`): the torch side is on the CPU.
        model.device = backend.torch_device
    # Counted without state_dict(), whose hooks are the user's and must not run here.
    tensors = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    start = time.perf_counter()
    show = bool(backend.params.get("log_initialization")) and sys.stderr.isatty()
    with tqdm(total=tensors, desc="initializing", unit="tensor", disable=not show) as bar:
        backend.state.refresh(initial=True, progress=bar)
    if show:
        inform(f"initialized {type(model).__name__} ({tensors} tensors) on the "
               f"{backend.backend_type} mesh {dict(backend.mesh.shape)} in "
               f"{time.perf_counter() - start:.2f} s")
    return CompiledModule(model, backend)
