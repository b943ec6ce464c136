"""Capture orchestration: run a step once on traced stand-ins of the run's state and the
call's tensors, and turn what it did into one compiled program.

Everything the step can read is bound to a traced value for the duration of the capture:
every state entry (module parameters and buffers, optimizer state, param-group tensors,
schedule counters), the gradients the torch side holds where the step reads them, the
optimizers' float hyperparameters, and the call's tensors. Device tensors the step reaches
some other way (a closure variable) are swapped for their cell's traced value; a module
that was never compiled is registered with a notice and the capture starts again.
"""
import contextlib
import contextvars
import functools
import gc
import logging
import math
import os
import re
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import bridge
import wafer
from bridge.capture import with_user_line
from bridge.device_tensor import DeviceTensor, GradSource
from bridge.precision import matmul_policy
from bridge import repeated_blocks
from cstorch import decompositions
from cstorch.backends import csx
from cstorch.distributed.batch_norm import PerProcessBatchNorm
from cstorch.metrics.metric import Metric
from cstorch.optim.optimizer import Optimizer
from cstorch.tracing import hooks, index_check, micro_batch, python_values
from cstorch.tracing.cumulative_batch_norm import cumulative_batch_norm
from cstorch.tracing.arguments import Call, Results

log = logging.getLogger("cstorch")

VALUE_READ_HINT = ("To look at a tensor's value, pass it to a function decorated with "
                   "@cstorch.step_closure, which runs after the step with the computed values.")

# cstorch's own code: its frames are never the user's line an error names.
_LIBRARY = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)

# The capture in progress, if any: step closures called during it are recorded here.
capturing = contextvars.ContextVar("cstorch_capture", default=None)


@dataclass
class ClosureCall:
    fn: Callable
    spec: Any                  # treespec of (args, kwargs)
    leaves: list               # leaves, tensors replaced by None
    tensor_positions: list     # leaf positions that hold step outputs
    checkpoint_only: bool


@dataclass
class CaptureContext:
    closures: list = field(default_factory=list)
    closure_tensors: list = field(default_factory=list)

    def record_closure(self, fn, args, kwargs, checkpoint_only):
        import torch.utils._pytree as pytree
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        # The values at the call, as eager code would read them then: a tensor written in
        # place later in the step (the learning rate a scheduler steps) is not seen.
        self.closure_tensors.extend(leaves[i].detach().clone() for i in positions)
        kept = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self.closures.append(ClosureCall(fn, spec, kept, positions, checkpoint_only))


@dataclass
class Program:
    """One captured and compiled step."""
    graph: Any
    jax_fn: Callable          # fn(state list, grads list, hyper, inputs list, rng) -> (state, grads, outs);
                              # hyper: the traced hyperparameters' values, then their complements
    compiled: Any             # wafer.CompiledStep
    names: list               # state names, in the order of the state list
    grad_inputs: list         # cells whose torch-side gradient is an input
    grad_outputs: list        # cells whose gradient the step leaves
    grad_rule: dict           # cell -> whether a gradient must be present for this program
    hyper: list               # (optimizer index, group index, key, tuple index) of traced hyperparameters
    results: Results
    out_dtypes: list          # torch dtype of every tensor output (results, then closures)
    out_shapes: list
    closures: list
    uses_rng: bool = True     # whether the program draws random numbers
    grad_source: Any = None   # bridge.device_tensor.GradSource of the gradients it leaves
    grads_bound: int = -1     # the state version the parameters' gradient slots were bound at
    grad_layout: Any = None   # gradients returned packed: see _grad_layout
    micro_batch_size: int | None = None   # None: the batch runs whole
    explored: Any = None      # micro_batch.ExploreResult of an "explore" program, which trains nothing
    finite_check: Any = None  # what each flag of the last output covers (debug.check_finite)
    # With debug.check_indices: the bridge.index_checks.IndexCheck each row of the last
    # output (after the finite flags) covers.
    index_checks: Any = None
    unread_grads: frozenset = frozenset()   # positions in grad_inputs the program never reads
    # An unread gradient input still needs an array of its shape: the first one passed is
    # kept and passed again, instead of slicing the pending gradient out every call.
    unread_grad_arrays: dict = field(default_factory=dict)
    # Host tensors the step closed over, which the program holds as constants, each with
    # its version counter (None for an inference tensor, which has none) and data pointer
    # at the capture: `constants_changed`.
    constants: tuple = ()
    # Python values the step may have read, as they were at the end of the capture
    # (`python_values`): attributes of the compiled modules, globals and closure variables.
    python_values: tuple = ()
    hooks: Any = None         # hooks.Hooks: the hooks the step ran, as at the capture
    # (result position, cell) of results that are a state tensor itself (`return
    # model.weight`): the call returns that tensor, as eager PyTorch returns the object.
    held_results: tuple = ()

    def constants_changed(self):
        """The first constant written in place (or given new data) since the capture,
        or None: the program still computes with the value it had then."""
        for t, version, data in self.constants:
            if (version is not None and t._version != version) or t.data_ptr() != data:
                return t
        return None

    def _body(self) -> str:
        """The graph's code without its signature, each input named for what it is: a
        program captured while gradients were present takes them as inputs even when it
        never reads them, which shifts the positional names of every later input."""
        n, g, h = len(self.names), len(self.grad_inputs), 2 * len(self.hyper)
        roles = {}
        for k, node in enumerate(n for n in self.graph.graph.nodes if n.op == "placeholder"):
            roles[node.name] = (f"state_{k}" if k < n else
                                f"grad_{self.grad_inputs[k - n]}" if k < n + g else
                                f"hyper_{k - n - g}" if k < n + g + h else
                                f"input_{k - n - g - h}")
        lines = self.graph.code.strip().split("\n")[1:]   # after `def forward(self, ...):`
        return re.sub(r"\b\w+\b", lambda m: roles.get(m.group(0), m.group(0)), "\n".join(lines))

    def computes_like(self, other) -> bool:
        """Whether `other`, captured for the same key, is this program again: the same
        graph, constants (closed-over tensors by identity, tensors made in the step by
        value), non-tensor results and step-closure arguments."""
        def equal(a, b):
            try:
                return bool(a == b)
            except Exception:   # values without a plain equality (arrays, ...)
                return False

        def made(program):
            gm = program.graph
            return [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]

        mine, theirs = made(self), made(other)
        return (self._body() == other._body()
                and [id(c[0]) for c in self.constants] == [id(c[0]) for c in other.constants]
                and len(mine) == len(theirs)
                and all(type(a) is type(b) and (
                    a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                    if isinstance(a, torch.Tensor) else equal(a, b))
                    for a, b in zip(mine, theirs))
                and self.grad_rule == other.grad_rule
                and self.micro_batch_size == other.micro_batch_size
                and equal(self.results, other.results)
                and len(self.closures) == len(other.closures)
                and all(a.fn is b.fn and equal(a.leaves, b.leaves)
                        for a, b in zip(self.closures, other.closures)))


class UnregisteredModule(Exception):
    def __init__(self, module):
        self.module = module


def _refuse_optimizers(on_host: set):
    """A step pre-hook refusing torch's optimizers, and cstorch optimizers whose
    parameters (ids in `on_host`) belong to no compiled module."""
    def hook(optimizer, args, kwargs):
        if id(optimizer) in on_host:
            raise RuntimeError(with_user_line(
                "the optimizer holds a parameter that belongs to no compiled module; call "
                "cstorch.compile(model) before creating the optimizer for its parameters"))
        _refuse_torch_optimizer(optimizer, args, kwargs)
    return hook


def _refuse_torch_optimizer(optimizer, args, kwargs):
    if isinstance(optimizer, Optimizer):
        return
    # torch's optimizers create their state lazily inside the step and hold the module's
    # own parameters, not the traced ones: under trace they would silently update nothing.
    name = type(optimizer).__name__
    raise TypeError(with_user_line(
        f"a torch.optim.{name} is used in a traced step; traced steps need optimizers whose "
        f"state exists before the first step: use cstorch.optim.{name} "
        f"(from cerebras.pytorch.optim) instead"))


@contextlib.contextmanager
def _refuse_torch_schedulers():
    """torch's schedulers write Python floats into the param groups: inside a step that
    would be undone by the next call. Refuse them there, naming cstorch's class."""
    import cstorch.optim.lr_scheduler as ours
    sched = torch.optim.lr_scheduler
    classes = [sched.LRScheduler, sched.ReduceLROnPlateau]
    saved = [c.__dict__.get("step") for c in classes]

    def refuse(self, *args, **kwargs):
        name = type(self).__name__
        alternative = (f"use cstorch.optim.lr_scheduler.{name}, which steps on the device inside "
                       "a traced step, or " if hasattr(ours, name) else "")
        raise RuntimeError(with_user_line(
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
def _refuse_torch_grad_scaler():
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
            raise RuntimeError(with_user_line(
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
def _track_zero_grad(leaves: dict, entry_grads: dict, cleared: set):
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
def _bind(backend, traced):
    """Point every state entry, and the optimizers' per-parameter state, at traced values."""
    state = backend.state
    saved = [(e, e.get()) for e in state.entries]
    for e in state.entries:
        e.set(traced[e.cell])
    keyed = [opt.keyed_by({id(e.tensor): traced[e.cell] for e in state.entries})
             for opt in backend.optimizers]
    with contextlib.ExitStack() as stack:
        for k in keyed:
            stack.enter_context(k)
        try:
            yield
        finally:
            for e, value in saved:
                e.set(value)


def hyperparameters(backend):
    """(where, group, key, tuple index, value) of every float hyperparameter; `where` is
    (optimizer index, group index)."""
    for o, opt in enumerate(backend.optimizers):
        for g, group, key, index, value in opt.hyperparameters():
            yield (o, g), group, key, index, value


@contextlib.contextmanager
def _bind_hyper(items, traced):
    """Point the param groups' float hyperparameters at traced scalars. `traced` holds the
    values, then their complements (`cstorch.optim._update.one_minus`)."""
    from cstorch.optim import _update
    values, comps = traced[:len(items)], traced[len(items):]
    token = _update.complements.set({id(v): c for v, c in zip(values, comps)})
    saved = []
    for (group, key, index, _), t in zip(items, values):
        saved.append((group, key, group[key]))
        if index is None:
            group[key] = t
        else:
            value = list(group[key])
            value[index] = t
            group[key] = tuple(value)
    try:
        yield
        for (group, key, index, _), t in zip(items, values):
            now = group[key] if index is None else group[key][index]
            if now is not t:
                # The program could not carry a value set here; restoring it would drop it.
                raise RuntimeError(
                    f"the param group's {key!r} was assigned inside the traced step, where a "
                    "float hyperparameter is an input of the compiled program and the new "
                    "value would be lost; assign it between steps (that reuses the program), "
                    "or drive it with a cstorch.optim.lr_scheduler, which steps on the device")
    finally:
        _update.complements.reset(token)
        for group, key, value in reversed(saved):
            group[key] = value


@contextlib.contextmanager
def _register_unseen_modules():
    """A module with real weights that no `cstorch.compile` covered, called in the step,
    stops the capture so it can be registered."""
    from torch._subclasses.fake_tensor import FakeTensor
    from cstorch.state import TrackedTable

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


def _stray_tensor_hook(state, traced, constants):
    """What an op inside the step sees for a real tensor it reached without an argument.
    A host tensor it lets through becomes a constant of the program, kept in `constants`
    (by id)."""
    def hook(t):
        if not traced:  # the capture's own set-up, before the step runs
            return t
        if isinstance(t, DeviceTensor):
            i = state.index.get(id(t.cell))
            if i is None:
                raise RuntimeError(with_user_line(
                    f"the traced step reads a tensor of shape {tuple(t.shape)} computed by an "
                    "earlier step (or held by another backend) without taking it as an "
                    "argument; pass it to the step function as an argument"))
            return t._apply_view(traced[i])
        if isinstance(t, torch.nn.Parameter):
            raise RuntimeError(with_user_line(
                f"the traced step reads a torch.nn.Parameter of shape {tuple(t.shape)} that "
                "belongs to no compiled module, so later changes to it could not reach the "
                "compiled program; pass the module that holds it to cstorch.compile before "
                "the first step (a parameter taken from a module before cstorch.compile is "
                "the old host tensor: take it from the module again)"))
        if t.requires_grad:
            raise RuntimeError(with_user_line(
                f"the traced step reads a tensor of shape {tuple(t.shape)} that requires grad "
                "but belongs to no compiled module: no gradient could reach it and its "
                "changes could not reach the compiled program; make it an nn.Parameter of "
                "a module passed to cstorch.compile, or read `t.detach()` to use its value "
                "as a constant"))
        constants.setdefault(id(t), t)
        return t
    return hook


@contextlib.contextmanager
def _older_objects_frozen():
    """Objects that exist now are left out of the garbage collector's passes until the end.

    Capturing, lowering and compiling a step allocate enough objects to set off a full
    collection, which walks every object torch and jax hold: 0.20-0.29 s of gpt-small's
    5 s first step (0.02-0.03 s with them frozen). They go back to the collector after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def capture_program(step_fn, backend, call: Call, name: str) -> Program:
    """Capture `step_fn` for this call, registering modules it uses that were not compiled."""
    while True:
        try:
            with _older_objects_frozen():
                return micro_batch.capture(
                    backend, call, name,
                    lambda micro: _capture(step_fn, backend, call, name, micro))
        except UnregisteredModule as e:
            module = e.module
            if isinstance(module, Metric):
                # Metrics are meant to be called in steps without being compiled.
                backend.state.add_metric(module)
                backend.state.refresh()
                continue
            print(f"cstorch: {type(module).__name__} used in {name} was not passed to "
                  f"cstorch.compile; its parameters and buffers are now state of the run as "
                  f"model{len(backend.modules)}", file=sys.stderr)
            backend.modules.append(module)
            backend.state.refresh()


def _capture(step_fn, backend, call: Call, name: str, micro=None) -> Program:
    state = backend.state
    state.sync()
    cells = list(state.cells)
    n = len(cells)
    needs_grad = state.grad_flags()
    params = {e.cell: e.tensor for e in state.entries if e.tensor.requires_grad}
    grad_in = [i for i in sorted(params) if params[i].has_grad()]
    hyper_all = list(hyperparameters(backend))
    hyper = [(*where, k, x) for where, g, k, x, v in hyper_all if v != 0]
    hyper_items = [(g, k, x, v) for where, g, k, x, v in hyper_all if v != 0]
    tensors = call.tensors
    ctx = CaptureContext()
    info = {}
    cleared: set = set()

    traced_now: list = []
    constants: dict = {}

    def step(*flat):
        traced = list(flat[:n])
        traced_now[:] = traced
        grads = flat[n:n + len(grad_in)]
        hyp = flat[n + len(grad_in):n + len(grad_in) + 2 * len(hyper)]
        inputs = flat[n + len(grad_in) + 2 * len(hyper):]
        entry_grads = {}
        for i, g in zip(grad_in, grads):
            traced[i].grad = g
            entry_grads[i] = g
        leaves = {i: traced[i] for i in params}
        for i, leaf in leaves.items():
            hooks.put_on_traced(params[i], leaf)
        args, kwargs = call.rebuild(inputs)
        with contextlib.ExitStack() as stack:
            stack.enter_context(_bind(backend, traced))
            stack.enter_context(_bind_hyper(hyper_items, hyp))
            stack.enter_context(_track_zero_grad(leaves, entry_grads, cleared))
            if micro is not None:
                stack.enter_context(micro.mark(leaves.values()))
            if backend.distributed and not backend.sync_batchnorm:
                stack.enter_context(PerProcessBatchNorm(backend.process_count))
            else:   # per-process statistics would need process 0's shard here too
                stack.enter_context(cumulative_batch_norm())
            token = capturing.set(ctx)
            stack.callback(capturing.reset, token)
            result = step_fn(*args, **kwargs)
            new_state = [None] * n
            for e in state.entries:
                if new_state[e.cell] is None:
                    new_state[e.cell] = e.get()
        grad_out = [i for i in sorted(params) if leaves[i].grad is not None]
        results, outs = Results.of(result)
        cell_of = {id(v): i for i, v in enumerate(new_state)}
        held = tuple((k, cell_of[id(t)]) for k, t in enumerate(outs) if id(t) in cell_of)
        outs = outs + list(ctx.closure_tensors)
        info.update(results=results, grad_out=grad_out, dtypes=[t.dtype for t in outs],
                    shapes=[tuple(t.shape) for t in outs], held_results=held)
        return new_state + [leaves[i].grad for i in grad_out] + outs

    shapes = ([_Spec(tuple(c.array.shape), c.dtype) for c in cells]
              + [_Spec(tuple(cells[i].array.shape), cells[i].dtype) for i in grad_in]
              + [_Spec((), torch.float32)] * (2 * len(hyper))
              + [_Spec(_global_shape(backend, t.shape), t.dtype) for t in tensors])
    if micro is not None:
        shapes = micro.capture_shapes(shapes, len(shapes) - len(tensors))
    requires_grad = needs_grad + [False] * (len(shapes) - n)
    # Identical layers are marked for the lowering to loop over (bridge.scan_blocks).
    runs = repeated_blocks.find_runs(state.named_modules()) \
        if csx.performance.scan_blocks and micro is None else []
    on_host = {id(opt) for opt in backend.optimizers if not opt.on_device}
    hook = register_optimizer_step_pre_hook(_refuse_optimizers(on_host))
    try:
        # Errors raised while the step runs (value reads, refusals) keep the user's frames
        # in their traceback and name the user's line.
        with _refuse_torch_schedulers(), _refuse_torch_grad_scaler(), \
                _register_unseen_modules(), repeated_blocks.marked(runs):
            graph = bridge.capture(step, shapes, requires_grad, value_read_hint=VALUE_READ_HINT,
                                   tensor_hook=_stray_tensor_hook(state, traced_now, constants),
                                   user_fn=step_fn, library=_LIBRARY,
                                   extra_decompositions=decompositions.table_for(
                                       backend.backend_type))
    finally:
        hook.remove()
    _write_graph(graph, backend.artifacts_dir, name)
    check_finite = csx.debug.check_finite
    if check_finite and micro is not None:
        warnings.warn("cstorch.backends.csx.debug.check_finite does not cover micro-batched "
                      "steps; set micro_batch_size=None to find where a NaN or Inf starts",
                      stacklevel=2)
    check_indices = index_check.enabled(backend)
    if check_indices and micro is not None and csx.debug.check_indices:
        warnings.warn("cstorch.backends.csx.debug.check_indices does not cover micro-batched "
                      "steps; set micro_batch_size=None to check their indices", stacklevel=2)
    if micro is None:
        lowered = bridge.lower(graph, check_finite=check_finite, check_indices=check_indices)
    else:
        lowered = micro.lower(graph, n, len(shapes) - len(tensors), backend.mesh)
        info["shapes"] = micro.output_shapes(info["shapes"], n + len(info["grad_out"]))
    grad_out = info["grad_out"]
    n_hyper = len(hyper)

    layout = _grad_layout([cells[i] for i in grad_out]) if len(backend.devices) == 1 else None
    policy = backend.matmul_policy
    # cstorch.mesh layouts mean a sharding on the emulated cluster only (elsewhere, none).
    boxes = functools.partial(wafer.box_mesh, backend.mesh) if backend.is_csx else None

    def jax_fn(state_arrays, grads, hyper_values, inputs, rng):
        def key():
            return jax.random.fold_in(jax.random.PRNGKey(rng[0]), rng[1])
        flat_hyper = [hyper_values[i] for i in range(2 * n_hyper)]
        with matmul_policy(policy), bridge.box_meshes(boxes):
            outs = lowered(*state_arrays, *grads, *flat_hyper, *inputs, key=key)
        grads_out = list(outs[n:n + len(grad_out)])
        if layout is not None:
            grads_out = _pack(grads_out, layout)
        return list(outs[:n]), grads_out, list(outs[n + len(grad_out):])

    inputs = [bridge.tensor_to_input(t) for t in tensors]
    if backend.distributed:
        inputs = [jax.ShapeDtypeStruct(_global_shape(backend, x.shape), x.dtype) for x in inputs]
    compiled = wafer.compile_step(
        jax_fn, ([c.array for c in cells], [cells[i].array for i in grad_in],
                 np.zeros(2 * n_hyper, np.float32), inputs, np.zeros(2, np.uint32)),
        mesh=backend.mesh, artifact_dir=backend.artifacts_dir, name=name,
        compile=not backend.params.get("validate_only"), replicate_outputs=backend.distributed,
        kept=_kept_state(graph, cells, backend) if micro is None else ())
    if backend.artifacts_dir:
        backend.layout_report(file=False)
    grad_rule = {i: (i in grad_in) for i in params if i not in cleared}
    return Program(graph, jax_fn, compiled, list(state.names), grad_in, grad_out, grad_rule,
                   hyper, info["results"], info["dtypes"], info["shapes"], ctx.closures,
                   uses_rng=_reads_last_input(compiled.jaxpr()), grad_layout=layout,
                   unread_grads=_unread_grad_inputs(compiled.jaxpr(), n, len(grad_in)),
                   grad_source=GradSource(), held_results=info["held_results"],
                   constants=tuple((t, None if t.is_inference() else t._version, t.data_ptr())
                                   for t in constants.values()),
                   python_values=_python_values(step_fn, state.named_modules()),
                   hooks=hooks.Hooks((m for _, m in state.named_modules()), params.values(),
                                     backend.optimizers),
                   finite_check=getattr(lowered, "checked", None) if check_finite else None,
                   # Filled when compile_step traced the function; empty: no such output.
                   index_checks=(lowered.index_checks or None) if micro is None
                   and check_indices else None)


# XLA copies a donated state array that is read after its new value could be made (a
# parameter read by the backward pass while the optimizer updates it from its gradient)
# before updating it in place. On the CPU such an array is not donated when it is at least
# this large: its new value then takes a buffer of its own, which holds as much as the copy
# did but costs no copying. Below the size, donation cost less in the measurements
# (docs/benchmarks.md, "Changes of 2026-12-06").
KEEP_MIN_BYTES = 256 * 1024


def _kept_state(graph, cells, backend) -> tuple:
    """Indices of the state arrays the program takes without donating them."""
    if backend.mesh.devices.flat[0].platform != "cpu":
        return ()
    late = bridge.read_after_update(graph, len(cells))
    return tuple(i for i, (read_late, c) in enumerate(zip(late, cells))
                 if read_late and math.prod(c.array.shape) * np.dtype(c.array.dtype).itemsize
                 >= KEEP_MIN_BYTES)


def _python_values(step_fn, named_modules) -> tuple:
    """The Python values the step may have read: see `python_values`."""
    classes = {cls for _, m in named_modules for cls in type(m).__mro__}
    methods: dict = {}
    for cls in classes:
        for name, f in vars(cls).items():
            if isinstance(f, types.FunctionType):
                methods.setdefault(name, []).append(f)
    return (python_values.module_attributes(named_modules)
            + python_values.function_values([step_fn] + methods.get("forward", []), methods,
                                            [m for _, m in named_modules]))


def _global_shape(backend, shape) -> tuple:
    """The shape a step argument has in the program: in a multi-process run, the global
    batch that this process's argument is a part of."""
    if backend.distributed:
        from cstorch.distributed.process_group import global_shape
        return global_shape(tuple(shape), backend.process_count)
    return tuple(shape)


def _write_graph(graph, artifact_dir, name):
    """The captured ATen graph, beside the jaxpr and StableHLO `wafer` writes."""
    if not artifact_dir:
        return
    os.makedirs(artifact_dir, exist_ok=True)
    with open(os.path.join(artifact_dir, f"{name}.aten.txt"), "w") as f:
        f.write(graph.print_readable(print_output=False))


# Packing small gradients into one array saves the per-output cost of the step's call (a few
# microseconds each); packing copies every byte, which costs more once gradients average
# more than about this many bytes (gpt-small's 13.8 MB of gradients: 6-10 ms a step).
PACK_MEAN_BYTES = 16 * 1024


def _grad_layout(cells):
    """(flat array index, offset, shape) per gradient when gradients are returned packed,
    one flat array per dtype; None when there is nothing to gain (at most one gradient, or
    gradients large enough that the copy costs more than the outputs it saves)."""
    total = sum(int(np.prod(c.array.shape, dtype=np.int64)) * c.array.dtype.itemsize
                for c in cells)
    if len(cells) < 2 or total > PACK_MEAN_BYTES * len(cells):
        return None
    flats, sizes, layout = {}, [], []
    for cell in cells:
        dtype = cell.array.dtype
        if dtype not in flats:
            flats[dtype] = len(flats)
            sizes.append(0)
        f = flats[dtype]
        layout.append((f, sizes[f], tuple(cell.array.shape)))
        sizes[f] += int(np.prod(cell.array.shape, dtype=np.int64))
    return layout


def _pack(grads, layout):
    parts = {}
    for g, (f, _, _) in zip(grads, layout):
        parts.setdefault(f, []).append(g.reshape(-1))
    return [jax.numpy.concatenate(parts[f]) for f in sorted(parts)]


def _unread_grad_inputs(closed_jaxpr, first: int, count: int) -> frozenset:
    """Positions among the gradient inputs (the jaxpr's inputs `first` to `first + count`)
    that the program never reads: a step that clears the gradients (`zero_grad`) before
    its backward pass takes the pending ones as inputs without using them."""
    jaxpr = closed_jaxpr.jaxpr
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars}
    return frozenset(k for k, v in enumerate(jaxpr.invars[first:first + count])
                     if id(v) not in used)


def _reads_last_input(closed_jaxpr) -> bool:
    """Whether the jaxpr uses its last input (the PRNG pair)."""
    jaxpr = closed_jaxpr.jaxpr
    rng = jaxpr.invars[-1]
    return any(v is rng for eqn in jaxpr.eqns for v in eqn.invars) or \
        any(v is rng for v in jaxpr.outvars)


@dataclass
class _Spec:
    """Shape and dtype of a state value: what capture fakes it from."""
    shape: tuple
    dtype: torch.dtype
