"""Hooks a captured step runs: the forward and backward hooks of the compiled modules, the
gradient hooks of their parameters, the optimizers' step hooks, and torch's global module
and optimizer hooks.

A parameter's hooks (`register_hook`, `register_post_accumulate_grad_hook`) are put on the
traced parameter the capture differentiates, so the program runs them as eager PyTorch
would. Registering or removing any of these hooks after a capture captures the step again.

Every hook PyTorch registers gets a handle id from one counter that only grows
(`RemovableHandle.next_id`), so the set of hooks in the watched tables has changed exactly
when their number or the sum of their ids has. A call compares the counter, and the number
of hooks in the tables that held any, and looks closer only when either moved.
"""
import weakref

import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch.utils.hooks import RemovableHandle

from bridge.device_tensor import DeviceTensor

# The tables whose hooks run when a module is called or differentiated; the `_with_kwargs`
# and `_always_called` tables hold flags for ids of these.
_MODULE_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                  "_backward_hooks")
_TENSOR_TABLES = ("_backward_hooks", "_post_accumulate_grad_hooks")
_OPTIMIZER_TABLES = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


def _own(hook) -> bool:
    """The hook a device tensor puts on itself to accumulate eager gradients onto a
    pending one: not the user's, and not part of any program."""
    return getattr(hook, "__func__", None) is DeviceTensor._materialize_grad


def put_on_traced(param, traced):
    """Register `param`'s gradient hooks on `traced`, its stand-in in the capture."""
    # Inside the capture, a device tensor stands for its traced value, even in attribute reads.
    with torch._C.DisableTorchFunction():
        grad_hooks = list((param._backward_hooks or {}).values())
        accumulate_hooks = list((param._post_accumulate_grad_hooks or {}).values())
    for hook in grad_hooks:
        if not _own(hook):
            traced.register_hook(hook)
    for hook in accumulate_hooks:
        traced.register_post_accumulate_grad_hook(hook)


class Hooks:
    """The hooks of the compiled modules, their parameters and the optimizers when a
    program was captured."""

    def __init__(self, modules, params, optimizers):
        # Weakly: a program kept by a traced step must not keep a dropped model alive.
        self._modules = [weakref.ref(m) for m in modules]
        self._params = [weakref.ref(p) for p in params]
        self._optimizers = [weakref.ref(o) for o in optimizers]
        self._look(self._tables())
        self.fingerprint = _fingerprint(self.tables)

    def _look(self, tables):
        # A new hook takes a new id, so only tables that hold hooks can change unseen: by a
        # removal.
        # Held weakly where the table allows it: a hook may be a method of its module.
        self._held = [_ref(t) for t in tables if any(not _own(h) for h in t.values())]
        self.seen, self.count = RemovableHandle.next_id, sum(map(len, self.tables))

    @property
    def tables(self) -> list:
        """The tables that held hooks at the last look."""
        return _live(self._held)

    def _tables(self) -> list:
        tables = [getattr(module_hooks, f"_global{name}") for name in _MODULE_TABLES]
        tables += [optimizer_hooks._global_optimizer_pre_hooks,
                   optimizer_hooks._global_optimizer_post_hooks]
        tables += [m.__dict__[name] for m in _live(self._modules) for name in _MODULE_TABLES
                   if name in m.__dict__]
        tables += [o.__dict__[name] for o in _live(self._optimizers) for name in _OPTIMIZER_TABLES
                   if name in o.__dict__]
        # A tensor's table exists from its first hook on: look again at every closer look.
        tables += [d for p in _live(self._params) for name in _TENSOR_TABLES
                   if (d := getattr(p, name, None)) is not None]
        return tables

    def changed(self) -> bool:
        """Whether a hook was registered in or removed from a watched table since the
        capture."""
        if self.seen == RemovableHandle.next_id and sum(map(len, self.tables)) == self.count:
            return False   # nothing registered anywhere, nothing removed from these
        tables = self._tables()
        if _fingerprint(tables) != self.fingerprint:
            return True
        self._look(tables)   # hooks came and went elsewhere, or a device tensor hooked itself
        return False


def _ref(table):
    """A weak reference to `table`, or a function returning it where it takes none."""
    try:
        return weakref.ref(table)
    except TypeError:   # a plain dict: held
        return lambda: table


def _live(refs) -> list:
    return [obj for r in refs if (obj := r()) is not None]


def _fingerprint(tables) -> tuple:
    ids = [k for table in tables for k, hook in table.items() if not _own(hook)]
    return len(ids), sum(ids)
