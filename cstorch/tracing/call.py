"""Calling a compiled step: its inputs gathered into one `StepData`, the program
dispatched, and its results handed back.

A call dispatches the program and returns at once: state, gradients and returned tensors
stay on the device as `DeviceTensor`s until something reads them.
"""
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree

import wafer
from bridge.convert import put_global, tensor_to_input, to_jax_dtype
from bridge.device_tensor import Absent, DeviceTensor, host_read_hooks
from cstorch.backend.process_group import global_inputs
from cstorch.errors import MissingStateError
from cstorch.notices import inform
from cstorch.tracing import index_check, state_slots
from cstorch.utils.data.executor import (defer_checkpoint_closure, defer_step_closure,
                                         is_checkpoint_step, loop_end_checks,
                                         note_step_output, runs_step_closures)

# A step's artifacts are written while its first call runs (`run`); they are on disk by
# the time any value is read on the host, and at the end of a data loop.
host_read_hooks.append(wafer.artifact_writer.wait)
loop_end_checks.append(wafer.artifact_writer.wait)


class StepData(NamedTuple):
    """Everything a compiled step takes, in the order it takes it: the state arrays (in
    the run's cell order), the pending gradients it reads, the float hyperparameters (then
    their complements), the call's tensors, and the (seed, step) pair its random key is
    folded from. The program returns the state, gradients and outputs the same way."""
    state: list
    grads: list
    hyper: Any
    inputs: list
    rng: Any


def put(host: np.ndarray, sharding):
    """A host value as a device array laid out by `sharding` (which may span processes)."""
    if sharding.is_fully_addressable:
        return jax.device_put(host, sharding)
    return put_global(host, sharding)


def rng_pair(backend):
    """(seed, step): the step's PRNG key is folded from these inside the program, so a
    run is reproducible from `torch.manual_seed` and each step draws new numbers."""
    return np.array([torch.initial_seed() % (2 ** 32), backend.step_count % (2 ** 32)], np.uint32)


class DeviceInputs:
    """The inputs of a step that are kept on the device between calls: the float
    hyperparameters (uploaded again only when a value changed), and the constant stand-in
    for the random pair of programs that draw no random numbers."""

    def __init__(self):
        self._hyper = (None, None, None)         # (mesh, group values, device vector)
        self._rng_placeholder = (None, None)     # (mesh, device array)

    def hyper(self, values, backend):
        mesh, cached_values, cached = self._hyper
        if values is cached_values and mesh is backend.mesh:  # the list `_groups` returned last time
            return cached
        wanted = [v for v in values if v != 0]
        if mesh is not backend.mesh or [v for v in cached_values if v != 0] != wanted:
            cached = put(np.asarray(wanted + [1 - v for v in wanted], np.float32),
                         wafer.replicated(backend.mesh))
        self._hyper = (backend.mesh, values, cached)
        return cached

    def rng(self, backend, program):
        if program.uses_rng:
            pair = rng_pair(backend)
            return put(pair, wafer.replicated(backend.mesh)) if backend.distributed else pair
        mesh, placeholder = self._rng_placeholder
        if mesh is not backend.mesh:
            placeholder = put(np.zeros(2, np.uint32), wafer.replicated(backend.mesh))
            self._rng_placeholder = (backend.mesh, placeholder)
        return placeholder


def step_data(program, values, backend, call, device_inputs: DeviceInputs) -> StepData:
    """The inputs of one call of `program`, as the compiled step takes them."""
    state = backend.state
    if program.unread_grads:
        grads = _grad_arguments(state, program)
    else:
        grads = [state.grad_param(i).grad_array() for i in program.grad_inputs]
    inputs = [tensor_to_input(t) for t in call.tensors]
    if backend.distributed:
        inputs = global_inputs(inputs, program.compiled.input_shardings, backend.process_count)
    arrays = state.arrays_list
    if program.slots is not None:
        arrays = state_slots.arguments(program.slots, arrays)
        state.holds_rows = True   # a group it stacked: its cells hold rows of the stacked array
    elif state.holds_rows:   # a program that takes every cell on its own
        state_slots.read_rows(arrays)
        state.holds_rows = False
    if program.slots is None and program.used is not None:
        arrays = [arrays[i] for i in program.used]
    return StepData(arrays, grads, device_inputs.hyper(values, backend), inputs,
                    device_inputs.rng(backend, program))


def run(program, data: StepData, backend, name: str):
    """Dispatch `program` on `data`; the run's state and gradients take its results, and
    the step's results are returned as the step function returned them."""
    state = backend.state
    # Every pending gradient dies in this step when each one it is given goes unread
    # (the others it clears or overwrites): they go now, not once its own are made.
    if len(program.unread_grads) == len(program.grad_inputs) and state.grads_from is not None:
        state.grads_from.grad_source.release()
    new_state, grads, outs = program.compiled(*data)
    wafer.artifact_writer.start()
    if program.slots is not None:
        state_slots.store(program.slots, state.arrays_list, new_state)
        state.holds_rows = True
    elif program.used is None:
        state.arrays_list[:] = new_state
    else:
        arrays = state.arrays_list
        for i, a in zip(program.used, new_state):
            arrays[i] = a
    backend.step_count += 1
    if program.index_checks is not None:
        outs = list(outs)
        index_check.note(outs.pop(), program.index_checks, name, backend.step_count)
    if program.finite_check is not None:
        outs = list(outs)
        _report_non_finite(outs.pop(), program)
    if state.grads_from is not program or program.grads_bound != state.version:
        _bind_grads(state, program)
    program.grad_source.publish(grads)
    values = [DeviceTensor.of(a, dt, shape)
              for a, dt, shape in zip(outs, program.out_dtypes, program.out_shapes)]
    for k, cell in program.held_results:
        values[k] = state.held_tensor(cell)
    if program.closures:
        _run_closures(program, values[len(program.results.positions):])
    results = program.results.rebuild(values)
    note_step_output(results)
    return results


def check_values(state):
    """With drop_data, refuse to run while a state tensor has no value."""
    missing = state.absent()
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise MissingStateError(
            f"cannot run the step: the backend was created with drop_data=True and these state "
            f"tensors have no value: {shown}. Load a checkpoint with values for every state "
            f"tensor first, e.g. state = cstorch.load(path); model.load_state_dict(state['model']); "
            f"optimizer.load_state_dict(state['optimizer'])")
    # Values are only ever added back (loads are kept): once complete, the same layout
    # needs no second look.
    state.complete_at = state.version


def warn_input_grad(name, tensors):
    """Eager PyTorch would fill an argument's `.grad` (or backpropagate into the graph
    it came from); a program takes its arguments as values."""
    which = [i for i, t in enumerate(tensors) if t.requires_grad]
    warnings.warn(
        f"cstorch: {name}: the argument tensor(s) at position(s) {which} of the step's "
        f"flattened arguments require grad, but a traced step takes its arguments as "
        f"values: no gradient reaches them (their .grad is left as it was, and the graph "
        f"they were computed by is not backpropagated into). To differentiate with "
        f"respect to an input, call requires_grad_() on it inside the step and use "
        f"torch.autograd.grad or its .grad there; pass x.detach() to silence this.",
        stacklevel=3)


def not_executed(program, backend):
    """A compile_only or validate_only call: the program was made, nothing runs. The
    results are tensors without values; closures that would read values are skipped."""
    wafer.artifact_writer.wait()
    mode = "compile_only" if backend.params.get("compile_only") else "validate_only"
    reason = f"the backend is {mode}, so steps are not executed"
    values = [DeviceTensor.of(Absent(shape, to_jax_dtype(dt), None, None, reason), dt, shape)
              for dt, shape in zip(program.out_dtypes, program.out_shapes)]
    for call in program.closures:
        if call.tensor_positions:
            inform(f"{mode}: step closure {getattr(call.fn, '__qualname__', call.fn)!r} "
                   f"skipped, it reads values that are not computed", once=True)
        elif not call.checkpoint_only or is_checkpoint_step():
            args, kwargs = pytree.tree_unflatten(list(call.leaves), call.spec)
            call.fn(*args, **kwargs)
    return program.results.rebuild(values)


def _report_non_finite(flags, program):
    """debug.check_finite: name the first input or op (in execution order) whose values
    were not all finite."""
    flags = np.asarray(flags)
    if flags.all():
        return
    where = program.finite_check[int(np.argmin(flags))]
    raise FloatingPointError(
        f"the step produced a NaN or Inf first at {where} (ATen op and the line of your code "
        f"that made it; for a gradient op, the line of the forward op it differentiates). "
        f"The step's results are in place; cstorch.backends.csx.debug.check_finite = False "
        f"turns this check off")


def _run_closures(program, values):
    """Hand the step's closures, with this step's values, to the running executor: they
    run once the loop's body is done, in the order they were called."""
    it = iter(values)
    fetched = runs_step_closures()
    for call in program.closures:
        leaves = list(call.leaves)
        for pos in call.tensor_positions:
            leaves[pos] = next(it)
        if not (call.checkpoint_only or fetched):
            continue
        args, kwargs = pytree.tree_unflatten(leaves, call.spec)
        if call.checkpoint_only:
            defer_checkpoint_closure(call.fn, args, kwargs)
        else:
            defer_step_closure(call.fn, args, kwargs)


def _bind_grads(state, program):
    """Point every parameter's gradient slot at this program's gradient outputs: the
    gradients its steps leave (None where it leaves none) until another program runs."""
    outputs = {cell: k for k, cell in enumerate(program.grad_outputs)}
    layout = program.grad_layout
    done = set()
    for e in state.entries:
        if e.tensor.requires_grad and id(e.tensor) not in done:
            done.add(id(e.tensor))
            k = outputs.get(e.cell)
            where = None if k is None else layout[k] if layout is not None else (k, None, None)
            e.tensor.grad_slot().bind(program.grad_source, where)
    state.grads_from, program.grads_bound = program, state.version


def _grad_arguments(state, program) -> list:
    """The gradient inputs of a program that leaves some of them unread: those are passed
    the array kept from the first call (any array of the right shape will do)."""
    kept = program.unread_grad_arrays
    args = []
    for k, i in enumerate(program.grad_inputs):
        if k not in program.unread_grads:
            args.append(state.grad_param(i).grad_array())
            continue
        if k not in kept:
            grad = state.grad_param(i).grad_array()
            kind = (grad.shape, grad.dtype, grad.sharding)
            kept[k] = next((a for a in kept.values() if (a.shape, a.dtype, a.sharding) == kind),
                           None)
            if kept[k] is None:
                kept[k] = jnp.zeros_like(grad)
        args.append(kept[k])
    return args
