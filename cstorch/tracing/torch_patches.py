"""What is patched into torch while a step is captured: refusals of what a compiled step
cannot honour (torch's optimizers, schedulers and GradScaler, modules no compile covered,
tensors reached without an argument), the record of which gradients the step clears, and
the garbage collector held off older objects."""
import contextlib
import gc

import torch
from torch._subclasses.fake_tensor import FakeTensor

import cstorch.optim.lr_scheduler as ours
from bridge.capture import with_user_line
from bridge.device_tensor import DeviceTensor
from cstorch.errors import StepRefusedError, TorchOptimizerInStepError
from cstorch.optim.optimizer import Optimizer
from cstorch.run.capture_context import UnregisteredModule
from cstorch.state import TrackedTable


def refuse_optimizers(on_host: set):
    """A step pre-hook refusing torch's optimizers, and cstorch optimizers whose
    parameters (ids in `on_host`) belong to no compiled module."""
    def hook(optimizer, args, kwargs):
        if id(optimizer) in on_host:
            raise StepRefusedError(with_user_line(
                "the optimizer holds a parameter that belongs to no compiled module; call "
                "cstorch.compile(model) before creating the optimizer for its parameters"))
        refuse_torch_optimizer(optimizer, args, kwargs)
    return hook


def refuse_torch_optimizer(optimizer, args, kwargs):
    if isinstance(optimizer, Optimizer):
        return
    # torch's optimizers create their state lazily inside the step and hold the module's
    # own parameters, not the traced ones: under trace they would silently update nothing.
    name = type(optimizer).__name__
    raise TorchOptimizerInStepError(with_user_line(
        f"a torch.optim.{name} is used in a traced step; traced steps need optimizers whose "
        f"state exists before the first step: use cstorch.optim.{name} "
        f"(from cerebras.pytorch.optim) instead"))


@contextlib.contextmanager
def refuse_torch_schedulers():
    """torch's schedulers write Python floats into the param groups: inside a step that
    would be undone by the next call. Refuse them there, naming cstorch's class."""
    sched = torch.optim.lr_scheduler
    classes = [sched.LRScheduler, sched.ReduceLROnPlateau]
    saved = [c.__dict__.get("step") for c in classes]

    def refuse(self, *args, **kwargs):
        name = type(self).__name__
        alternative = (f"use cstorch.optim.lr_scheduler.{name}, which steps on the device inside "
                       "a traced step, or " if hasattr(ours, name) else "")
        raise StepRefusedError(with_user_line(
            f"torch.optim.lr_scheduler.{name}.step() was called inside a traced step, where its "
            f"Python-side learning rate cannot follow the compiled program; {alternative}call "
            "scheduler.step() outside the traced function, between steps (that reuses the "
            "compiled program: learning rates are inputs of the step)"))
    for c in classes:
        c.step = refuse
    try:
        yield
    finally:
        for c, s in zip(classes, saved):
            if s is None:
                del c.step
            else:
                c.step = s


@contextlib.contextmanager
def refuse_torch_grad_scaler():
    """torch.amp.GradScaler decides on the host, from `found_inf.item()`, whether to skip
    the optimizer step. Refuse an enabled one where the step uses it, naming the class to
    use; a disabled one only passes values through and stays allowed."""
    cls = torch.amp.GradScaler
    names = ("scale", "unscale_", "step", "update")
    saved = {k: cls.__dict__[k] for k in names}

    def refusing(name):
        original = saved[name]

        def method(self, *args, **kwargs):
            if not self.is_enabled() or type(self).__module__.split(".")[0] in ("cstorch",
                                                                             "cerebras"):
                return original(self, *args, **kwargs)
            raise StepRefusedError(with_user_line(
                f"torch.amp.GradScaler.{name}() was called inside a traced step: the scaler "
                "reads the gradients' values on the host to decide whether to skip the "
                "optimizer step, which a compiled step cannot do. Use cstorch.amp.GradScaler "
                "(from cerebras.pytorch.amp), which keeps the loss scale and that decision on "
                "the device, or create the torch scaler with enabled=False"))
        return method
    for k in names:
        setattr(cls, k, refusing(k))
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(cls, k, v)


@contextlib.contextmanager
def track_zero_grad(leaves: dict, entry_grads: dict, cleared: set):
    """Record the traced parameters whose gradient the step sets to None before anything
    else touched it: their torch-side gradient at the call does not matter."""
    originals = (torch.nn.Module.zero_grad, torch.optim.Optimizer.zero_grad)

    def wrap(original):
        def zero_grad(self, *args, **kwargs):
            before = {i: t.grad for i, t in leaves.items()}
            result = original(self, *args, **kwargs)
            for i, t in leaves.items():
                if t.grad is None and before[i] is entry_grads.get(i):
                    cleared.add(i)
            return result
        return zero_grad
    torch.nn.Module.zero_grad = wrap(originals[0])
    torch.optim.Optimizer.zero_grad = wrap(originals[1])
    try:
        yield
    finally:
        torch.nn.Module.zero_grad, torch.optim.Optimizer.zero_grad = originals


@contextlib.contextmanager
def register_unseen_modules():
    """A module with real weights that no `cstorch.compile` covered, called in the step,
    stops the capture so it can be registered."""

    def hook(module, args):
        if isinstance(module.__dict__.get("_parameters"), TrackedTable):
            return
        own = [t for t in list(module._parameters.values()) + list(module._buffers.values())
               if t is not None]
        if any(not isinstance(t, FakeTensor) for t in own):
            raise UnregisteredModule(module)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def stray_tensor_hook(state, traced, constants):
    """What an op inside the step sees for a real tensor it reached without an argument.
    A host tensor it lets through becomes a constant of the program, kept in `constants`
    (by id)."""
    def hook(t):
        if not traced:  # the capture's own set-up, before the step runs
            return t
        if isinstance(t, DeviceTensor):
            i = state.index.get(id(t.cell))
            if i is None:
                raise StepRefusedError(with_user_line(
                    f"the traced step reads a tensor of shape {tuple(t.shape)} computed by an "
                    "earlier step (or held by another backend) without taking it as an "
                    "argument; pass it to the step function as an argument"))
            return t._apply_view(traced[i])
        if isinstance(t, torch.nn.Parameter):
            raise StepRefusedError(with_user_line(
                f"the traced step reads a torch.nn.Parameter of shape {tuple(t.shape)} that "
                "belongs to no compiled module, so later changes to it could not reach the "
                "compiled program; pass the module that holds it to cstorch.compile before "
                "the first step (a parameter taken from a module before cstorch.compile is "
                "the old host tensor: take it from the module again)"))
        if t.requires_grad:
            raise StepRefusedError(with_user_line(
                f"the traced step reads a tensor of shape {tuple(t.shape)} that requires grad "
                "but belongs to no compiled module: no gradient could reach it and its "
                "changes could not reach the compiled program; make it an nn.Parameter of "
                "a module passed to cstorch.compile, or read `t.detach()` to use its value "
                "as a constant"))
        constants.setdefault(id(t), t)
        return t
    return hook


@contextlib.contextmanager
def collector_paused():
    """No garbage collection while a step is captured, lowered and compiled; objects that
    exist now are left out of any pass made all the same (a `gc.collect()` in the step).

    These allocate enough objects to set off collections, full ones among them: each
    walked every object torch and jax hold until those were frozen, and still walks all
    the capture has made so far, more the deeper the model. What a capture leaves in
    reference cycles is little (docs/benchmarks.md measures both). After, the objects go
    back to the collector, which runs again unless it was off before."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
