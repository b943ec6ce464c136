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
import functools
import logging
import math
import os
import types
import warnings
from dataclasses import dataclass, field

import jax
import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import bridge
import wafer
from bridge.device_tensor import GradSource
from bridge.half_products import HalfProducts
from bridge.precision import matmul_policy
from bridge import copied_updates, repeated_blocks, traced_once
from cstorch import decompositions
from cstorch.backend.process_group import global_shape
from cstorch.backends import csx
from cstorch.distributed.batch_norm import PerProcessBatchNorm
from cstorch.metrics.metric import Metric
from cstorch.notices import inform
from cstorch.optim.optimizer import hyperparameters
from cstorch.run.capture_context import CaptureContext, UnregisteredModule, capturing
from cstorch.tracing import (hooks, implicit_loop_program, index_check, micro_batch,
                             progress, python_values, reuse, state_slots)
from cstorch.tracing.arguments import Call, Results
from cstorch.tracing.binding import bind_state, bind_hyperparameters
from cstorch.tracing.cumulative_batch_norm import cumulative_batch_norm
from cstorch.tracing.grad_packing import grad_layout, pack_grads
from cstorch.tracing.program import Program, ValueSpec
from cstorch.tracing.torch_patches import (collector_paused, refuse_optimizers,
                                           refuse_torch_grad_scaler, refuse_torch_schedulers,
                                           register_unseen_modules, stray_tensor_hook,
                                           track_zero_grad)

log = logging.getLogger("cstorch")

VALUE_READ_HINT = ("To look at a tensor's value, pass it to a function decorated with "
                   "@cstorch.step_closure, which runs after the step with the computed values.")

# cstorch's own code: its frames are never the user's line an error names.
_LIBRARY = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def capture_program(step_fn, backend, call: Call, name: str, like=()) -> Program:
    """Capture `step_fn` for this call, registering modules it uses that were not compiled.
    Micro-batching is entered only where it applies (`micro_batch.applies`). Where the
    capture computes like one of the programs `like` (same key, set aside for a changed
    Python value), that program's compiled step is taken instead of compiling again
    (`reuse.py`)."""
    while True:
        try:
            with collector_paused(), progress.shown(name):
                if micro_batch.applies(backend, name):
                    return micro_batch.capture(
                        backend, call, name,
                        lambda micro: _capture(step_fn, backend, call, name, micro))
                return _capture(step_fn, backend, call, name, like=like)
        except UnregisteredModule as e:
            _register(backend, e.module, name)


def _register(backend, module, name):
    """Make a module the step used without `cstorch.compile` state of the run."""
    if isinstance(module, Metric):
        # Metrics are meant to be called in steps without being compiled.
        backend.state.add_metric(module)
    else:
        position = backend.modules.append(module)
        inform(f"{type(module).__name__} used in {name} was not passed to "
               f"cstorch.compile; its parameters and buffers are now state of the run as "
               f"model{position or ''}")
    backend.state.refresh()


@dataclass
class _Layout:
    """What a capture's traced function takes, in order: the state cells, the gradients
    the torch side holds where the step may read them, the float hyperparameters that are
    not zero (values, then complements), then the call's tensors."""
    cells: list
    params: dict              # cell -> the state tensor requiring grad held in it
    grad_in: list             # cells whose pending gradient is an input
    hyper: list               # (optimizer index, group index, key, tuple index)
    hyper_items: list         # (group, key, tuple index, value), as `hyper`
    tensors: list

    @classmethod
    def of(cls, backend, call: Call) -> "_Layout":
        state = backend.state
        params = {e.cell: e.tensor for e in state.entries if e.tensor.requires_grad}
        nonzero = [h for h in hyperparameters(backend.optimizers) if h[4] != 0]
        return cls(cells=list(state.cells), params=params,
                   grad_in=[i for i in sorted(params) if params[i].has_grad()],
                   hyper=[(*where, k, x) for where, g, k, x, v in nonzero],
                   hyper_items=[(g, k, x, v) for where, g, k, x, v in nonzero],
                   tensors=call.tensors)

    def split(self, flat):
        """(state, gradients, hyperparameters, tensors) of the traced function's inputs."""
        n, g, h = len(self.cells), len(self.grad_in), 2 * len(self.hyper)
        return flat[:n], flat[n:n + g], flat[n + g:n + g + h], flat[n + g + h:]

    def specs(self, backend) -> list:
        cells = self.cells
        return ([ValueSpec(tuple(c.array.shape), c.dtype) for c in cells]
                + [ValueSpec(tuple(cells[i].array.shape), cells[i].dtype) for i in self.grad_in]
                + [ValueSpec((), torch.float32)] * (2 * len(self.hyper))
                + [ValueSpec(_global_shape(backend, t.shape), t.dtype) for t in self.tensors])


@dataclass
class _Outcome:
    """What the step did while it was traced, beyond the graph."""
    ctx: CaptureContext = field(default_factory=CaptureContext)
    cleared: set = field(default_factory=set)   # cells whose gradient it set to None first
    constants: dict = field(default_factory=dict)   # id -> host tensor it closed over
    traced: list = field(default_factory=list)  # the traced state, while the step runs
    results: Results | None = None
    grad_out: list = field(default_factory=list)    # cells whose gradient it leaves
    dtypes: list = field(default_factory=list)      # of every tensor output
    shapes: list = field(default_factory=list)
    held: tuple = ()          # (result position, cell) of results that are state tensors
    loop: implicit_loop_program.LoopSpec | None = None   # where the step's implicit loop is


def _traced_function(step_fn, backend, call: Call, layout: _Layout, outcome: _Outcome,
                     micro):
    """The function bridge.capture traces: the step run with the run bound to its inputs,
    returning the new state, the gradients it leaves and its tensor outputs."""
    state = backend.state
    n = len(layout.cells)

    def step(*flat):
        traced, grads, hyper, inputs = layout.split(flat)
        traced = list(traced)
        outcome.traced[:] = traced
        entry_grads = {}
        for i, g in zip(layout.grad_in, grads):
            traced[i].grad = g
            entry_grads[i] = g
        leaves = {i: traced[i] for i in layout.params}
        for i, leaf in leaves.items():
            hooks.put_on_traced(layout.params[i], leaf)
        args, kwargs = call.rebuild(inputs)
        with contextlib.ExitStack() as stack:
            stack.enter_context(bind_state(backend, traced))
            stack.enter_context(bind_hyperparameters(layout.hyper_items, hyper))
            stack.enter_context(track_zero_grad(leaves, entry_grads, outcome.cleared))
            if micro is not None:
                stack.enter_context(micro.mark(leaves.values()))
            if backend.distributed and not backend.sync_batchnorm:
                stack.enter_context(PerProcessBatchNorm(backend.process_count))
            else:   # per-process statistics would need process 0's shard here too
                stack.enter_context(cumulative_batch_norm())
            if backend.is_csx:   # a CSX compile takes half x float32 products
                stack.enter_context(HalfProducts(_half_products_taken))
            token = capturing.set(outcome.ctx)
            stack.callback(capturing.reset, token)
            loop = stack.enter_context(implicit_loop_program.recording())
            result = step_fn(*args, **kwargs)
            new_state = [None] * n
            for e in state.entries:
                if new_state[e.cell] is None:
                    new_state[e.cell] = e.get()
        outcome.grad_out = [i for i in sorted(layout.params) if leaves[i].grad is not None]
        outcome.results, outs = Results.of(result)
        cell_of = {id(v): i for i, v in enumerate(new_state)}
        outcome.held = tuple((k, cell_of[id(t)]) for k, t in enumerate(outs) if id(t) in cell_of)
        outs = outs + list(outcome.ctx.closure_tensors)
        outcome.dtypes = [t.dtype for t in outs]
        outcome.shapes = [tuple(t.shape) for t in outs]
        outcome.loop, loop_outs = loop.finish(inputs, outs, outcome.grad_out, micro)
        return new_state + [leaves[i].grad for i in outcome.grad_out] + outs + loop_outs
    return step


def _half_products_taken(names):
    # Eager PyTorch refuses these products: say once that this run takes them.
    inform(f"a CSX step multiplies half-precision tensors with float32 ones "
           f"({', '.join(sorted(names))}), which eager PyTorch refuses; as a CSX compile "
           f"does, the float32 operands are rounded to the half dtype first", once=True)


def _trace(step_fn, backend, call, layout, outcome, micro, once=frozenset()):
    """The step's ATen graph, traced on stand-ins with torch's refusals in place. With
    "layers" in `once`, the layers of each run of identical layers after the first are not
    traced but copied from it (`bridge.traced_once`); with "updates", an optimizer's
    update of alike parameters is traced for the first of each kind and copied for the
    others (`bridge.copied_updates`)."""
    state = backend.state
    shapes = layout.specs(backend)
    if micro is not None:
        shapes = micro.capture_shapes(shapes, len(shapes) - len(layout.tensors))
    requires_grad = state.grad_flags() + [False] * (len(shapes) - len(layout.cells))
    runs, looped = _identical_layers(state, micro)
    on_host = {id(opt) for opt in backend.optimizers if not opt.on_device}
    hook = register_optimizer_step_pre_hook(refuse_optimizers(on_host))
    once = once if csx.performance.trace_blocks_once else frozenset()
    try:
        return _trace_with(step_fn, backend, call, layout, outcome, micro, shapes,
                           requires_grad, runs, once, looped)
    finally:
        hook.remove()


def _identical_layers(state, micro):
    """(runs of identical layers, whether they loop): found when a run is traced once
    (`trace_blocks_once`) or lowered as one loop (`scan_blocks`)."""
    performance = csx.performance
    looped = performance.scan_blocks
    if looped:
        unlooped = ("a micro-batched step" if micro is not None else
                    "debug.check_finite is on" if csx.debug.check_finite else None)
        if unlooped is not None:
            looped = False
            flags = "scan_blocks and scan_blocks_remat have" if performance.scan_blocks_remat \
                else "scan_blocks has"
            warnings.warn(f"cstorch.backends.csx.performance.{flags} no effect here: "
                          f"{unlooped}, whose layers are compiled one by one", stacklevel=3)
    elif performance.scan_blocks_remat:
        warnings.warn("cstorch.backends.csx.performance.scan_blocks_remat has no effect while "
                      "scan_blocks is False: only the layers of a loop are rematerialised; set "
                      "scan_blocks = True as well", stacklevel=3)
    if not (looped or performance.trace_blocks_once):
        return [], False
    # A loop needs its layers alike in every attribute; tracing once needs only their
    # torch calls alike, which it checks call by call (transformers' layers each keep
    # their own `layer_idx`).
    return repeated_blocks.find_runs(state.named_modules(), attributes=looped), looped


def _trace_with(step_fn, backend, call, layout, outcome, micro, shapes, requires_grad, runs,
                once, looped):
    state = backend.state
    # Errors raised while the step runs (value reads, refusals) keep the user's frames
    # in their traceback and name the user's line.
    with refuse_torch_schedulers(), refuse_torch_grad_scaler(), register_unseen_modules(), \
            repeated_blocks.marked(runs), \
            traced_once.stand_ins(runs if "layers" in once else []) as layers, \
            _updates_copied("updates" in once) as updates:
        graph = bridge.capture(
            _traced_function(step_fn, backend, call, layout, outcome, micro), shapes,
            requires_grad, value_read_hint=VALUE_READ_HINT,
            tensor_hook=stray_tensor_hook(state, outcome.traced, outcome.constants),
            user_fn=step_fn, library=_LIBRARY,
            extra_decompositions=decompositions.table_for(backend.backend_type),
            graph_pass=_expand(layers, updates))
    if runs and not looped and micro is not None:
        repeated_blocks.unmark(graph)
    return graph


def _updates_copied(copied):
    """An optimizer's update traced once per kind of alike parameters (`copied`), or every
    update traced."""
    return copied_updates.copies() if copied else contextlib.nullcontext()


def _expand(layers, updates):
    """The graph pass that puts copies of the ops traced once in place of their stand-ins."""
    def expand(gm):
        layers.expand(gm)
        if updates is not None:
            updates.expand(gm)
    return expand


def _lower(graph, backend, layout, outcome, micro, stack_grads=False):
    """The graph as a JAX function, with the debug checks asked for. With `stack_grads`,
    gradients a loop leaves stacked may be returned that way (not when they are packed)."""
    check_finite = csx.debug.check_finite
    check_indices = index_check.enabled(backend)
    if micro is None:
        # A loop's parameters and their optimizer state are held stacked where the state
        # lives on one device and the step is not an implicit loop of its own.
        stackable = outcome.loop is None and len(backend.devices) == 1
        lowered = bridge.lower(graph, check_finite=check_finite, check_indices=check_indices,
                               remat_loops=csx.performance.scan_blocks_remat,
                               layer_calls=not csx.performance.scan_blocks,
                               state_count=len(layout.cells) if stackable else 0,
                               grad_count=len(outcome.grad_out) if stackable and stack_grads
                               else 0)
        if outcome.loop is None:
            return lowered
        n = len(layout.cells)
        return implicit_loop_program.around(lowered, outcome.loop, n,
                                            n + len(layout.grad_in) + 2 * len(layout.hyper))
    if check_finite:
        warnings.warn("cstorch.backends.csx.debug.check_finite does not cover micro-batched "
                      "steps; set micro_batch_size=None to find where a NaN or Inf starts",
                      stacklevel=2)
    if check_indices and csx.debug.check_indices:
        warnings.warn("cstorch.backends.csx.debug.check_indices does not cover micro-batched "
                      "steps; set micro_batch_size=None to check their indices", stacklevel=2)
    n = len(layout.cells)
    lowered = micro.lower(graph, n, n + len(layout.grad_in) + 2 * len(layout.hyper),
                          backend.mesh)
    outcome.shapes = micro.output_shapes(outcome.shapes, n + len(outcome.grad_out))
    return lowered


def _jax_fn(lowered, backend, layout, outcome, packing, used, slots):
    """fn(state list, grads list, hyper, inputs list, rng) -> (state, grads, outs) of the
    lowered graph, under the backend's matmul policy and mesh annotations. The state list
    holds the cells `used` (None: every cell), as `slots` lays them out
    (`state_slots`)."""
    n, n_grads, n_hyper = len(layout.cells), len(outcome.grad_out), 2 * len(layout.hyper)
    taken = range(n) if used is None else used
    groups = getattr(lowered, "stacked", ())
    untouched = [] if used is None else [
        (i, tuple(c.array.shape), c.array.dtype) for i, c in enumerate(layout.cells)
        if i not in set(used)]
    policy = backend.matmul_policy
    # cstorch.mesh layouts mean a sharding on the emulated cluster only (elsewhere, none).
    boxes = functools.partial(wafer.box_mesh, backend.mesh) if backend.is_csx else None

    def jax_fn(state_arrays, grads, hyper_values, inputs, rng):
        def key():
            return jax.random.fold_in(jax.random.PRNGKey(rng[0]), rng[1])
        flat_hyper = [hyper_values[i] for i in range(n_hyper)]
        by_cell = state_slots.expand(slots, state_arrays, taken, groups)
        full = [by_cell.get(i) for i in range(n)]
        for i, shape, dtype in untouched:   # stand-ins the graph never reads, which XLA leaves out
            full[i] = jax.numpy.zeros(shape, dtype)
        with matmul_policy(policy), bridge.box_meshes(boxes):
            outs = lowered(*full, *grads, *flat_hyper, *inputs, key=key)
        grads_out = list(outs[n:n + n_grads])
        if packing is not None:
            grads_out = pack_grads(grads_out, packing)
        return state_slots.contract(slots, outs[:n], groups), grads_out, list(outs[n + n_grads:])
    return jax_fn


def _capture(step_fn, backend, call: Call, name: str, micro=None, like=()) -> Program:
    state = backend.state
    state.sync()
    layout = _Layout.of(backend, call)
    outcome = _Outcome()
    once = {"layers", "updates"}
    progress.phase("tracing")
    while True:
        try:
            graph = _trace(step_fn, backend, call, layout, outcome, micro, once)
            break
        except traced_once.NotTracedOnce as e:
            what = "updates" if isinstance(e, copied_updates.NotCopied) else "layers"
            if what not in once:
                raise
            once.discard(what)
            log.info("%s are traced one by one: %s", "alike parameters' updates"
                     if what == "updates" else "identical layers", e)
            outcome = _Outcome()
    _write_graph(graph, backend.artifacts_dir, name)
    if like and micro is None and outcome.loop is None:
        traced = Program(
            graph=graph, jax_fn=None, compiled=None, names=list(state.names),
            grad_inputs=layout.grad_in, grad_outputs=outcome.grad_out,
            grad_rule=_grad_rule(layout, outcome), hyper=layout.hyper,
            results=outcome.results, out_dtypes=outcome.dtypes, out_shapes=outcome.shapes,
            closures=outcome.ctx.closures, held_results=outcome.held,
            constants=_constants(outcome),
            python_values=python_values_of(step_fn, state.named_modules()),
            hooks=_hooks(backend, layout))
        found = reuse.compiled_like(traced, like)
        if found is not None:
            return found
    progress.phase("lowering and compiling")
    cells = layout.cells
    packing = (grad_layout([cells[i] for i in outcome.grad_out])
                if len(backend.devices) == 1 else None)
    lowered = _lower(graph, backend, layout, outcome, micro, stack_grads=packing is None)
    rows = _grad_rows(getattr(lowered, "stacked_grads", ()), len(outcome.grad_out))
    used = _used_cells(graph, len(cells)) if micro is None else None
    taken = range(len(cells)) if used is None else used
    stacked = getattr(lowered, "stacked", ())
    kept = _kept_state(graph, cells, backend, taken, stacked) if micro is None else ()
    kept_cells = {taken[k] for k in kept}
    slots = state_slots.slots(taken, [g for g in stacked if not kept_cells.intersection(g)])
    jax_fn = _jax_fn(lowered, backend, layout, outcome, packing, used, slots)
    inputs = [bridge.tensor_to_input(t) for t in layout.tensors]
    if backend.distributed:
        inputs = [jax.ShapeDtypeStruct(_global_shape(backend, x.shape), x.dtype) for x in inputs]
    at = {s if type(s) is int else s[0]: k for k, s in enumerate(slots)}
    compiled = wafer.compile_step(
        jax_fn, ([_example(cells, s) for s in slots], [cells[i].array for i in layout.grad_in],
                 np.zeros(2 * len(layout.hyper), np.float32), inputs, np.zeros(2, np.uint32)),
        mesh=backend.mesh, artifact_dir=backend.artifacts_dir, name=name,
        compile=not backend.params.get("validate_only"), replicate_outputs=backend.distributed,
        kept=tuple(at[taken[k]] for k in kept))
    if backend.artifacts_dir:
        backend.layout_report(file=False)
    checked = micro is None and index_check.enabled(backend)
    return Program(
        graph=graph, jax_fn=jax_fn, compiled=compiled, names=list(state.names),
        grad_inputs=layout.grad_in, grad_outputs=outcome.grad_out,
        grad_rule=_grad_rule(layout, outcome),
        hyper=layout.hyper, results=outcome.results, out_dtypes=outcome.dtypes,
        out_shapes=outcome.shapes, closures=outcome.ctx.closures,
        uses_rng=_reads_last_input(compiled.jaxpr()), grad_layout=packing or rows,
        unread_grads=_unread_grad_inputs(compiled.jaxpr(), len(slots), len(layout.grad_in)),
        used=used, slots=slots if len(slots) != len(taken) else None,
        grad_source=GradSource(), held_results=outcome.held,
        constants=_constants(outcome),
        python_values=python_values_of(step_fn, state.named_modules()),
        hooks=_hooks(backend, layout),
        finite_check=getattr(lowered, "checked", None) if csx.debug.check_finite else None,
        # Filled when compile_step traced the function; empty: no such output.
        index_checks=(lowered.index_checks or None) if checked else None)


def _grad_rows(groups, count):
    """The gradient slots' places (`GradSlot.where`) where the program returns groups of
    gradients stacked: row k of the group's output; None where it returns none so."""
    if not groups:
        return None
    where = [(j, None, None) for j in range(count)]
    for g in groups:
        for k, j in enumerate(g):
            where[j] = (g[0], k, None)
    return where


def _example(cells, slot):
    """A state entry of the program as the compiler is shown it."""
    if type(slot) is int:
        return cells[slot].array
    first = cells[slot[0]].array
    return jax.ShapeDtypeStruct((len(slot), *first.shape), first.dtype)


def _grad_rule(layout, outcome) -> dict:
    return {i: (i in layout.grad_in) for i in layout.params if i not in outcome.cleared}


def _constants(outcome) -> tuple:
    return tuple((t, None if t.is_inference() else t._version, t.data_ptr())
                 for t in outcome.constants.values())


def _hooks(backend, layout):
    return hooks.Hooks((m for _, m in backend.state.named_modules()), layout.params.values(),
                       backend.optimizers)


# XLA copies a donated state array that is read after its new value could be made (a
# parameter read by the backward pass while the optimizer updates it from its gradient)
# before updating it in place. On the CPU such an array is not donated when it is at least
# this large: its new value then takes a buffer of its own, which holds as much as the copy
# did but costs no copying. Below the size, donation cost less in the measurements
# (docs/benchmarks.md, on donation).
KEEP_MIN_BYTES = 256 * 1024
# Each kept array's new value takes a buffer while the old one is still held: beyond this
# many bytes of them in one program, every array is donated, and XLA's copies (scratch
# memory it reuses) cost less memory than the kept arrays' second buffers (a 153M-parameter
# GPT: 0.93 GB less peak host memory, docs/benchmarks.md).
KEEP_MAX_TOTAL_BYTES = 64 * 1024 * 1024


def _kept_state(graph, cells, backend, taken, stacked=()) -> tuple:
    """Positions, among the state arrays the program takes (the cells `taken`), of those
    it takes without donating them. The cells of a `stacked` group (the layers of a loop,
    `bridge.stacked_state`) are donated: the loop reads each layer's row before the
    update of the whole array can start, so XLA copies nothing, and a kept member would
    make the program stack the group from its cells, a copy of every row each step."""
    if backend.mesh.devices.flat[0].platform != "cpu":
        return ()
    late = bridge.read_after_update(graph, len(cells))
    in_groups = {i for group in stacked for i in group}
    sizes = {k: math.prod(cells[i].array.shape) * np.dtype(cells[i].array.dtype).itemsize
             for k, i in enumerate(taken) if late[i] and i not in in_groups}
    kept = {k: size for k, size in sizes.items() if size >= KEEP_MIN_BYTES}
    if sum(kept.values()) > KEEP_MAX_TOTAL_BYTES:
        return ()
    return tuple(sorted(kept))


def _used_cells(graph, n):
    """The state cells the graph reads or writes, or None when it touches every one."""
    untouched = bridge.untouched_inputs(graph, n)
    if not any(untouched):
        return None
    return tuple(i for i, u in enumerate(untouched) if not u)


def python_values_of(step_fn, named_modules) -> tuple:
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
        return global_shape(tuple(shape), backend.process_count)
    return tuple(shape)


def _write_graph(graph, artifact_dir, name):
    """The captured ATen graph, beside the jaxpr and StableHLO `wafer` writes (like them,
    written while the step's first call runs: `wafer.artifact_writer`)."""
    if not artifact_dir:
        return

    def write():
        os.makedirs(artifact_dir, exist_ok=True)
        with open(os.path.join(artifact_dir, f"{name}.aten.txt"), "w") as f:
            f.write(graph.print_readable(print_output=False))
    wafer.artifact_writer.defer(write, f"the captured graph of {name} in {artifact_dir}")


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


