"""`@cstorch.trace`: the program cache, and calling a compiled step.

A call finds its program by what programs depend on: the call's arguments (tensors by
shape and dtype, everything else by value), the run's state layout (`RunState.version`:
entries, ties, modules used), `requires_grad` and train/eval flags, and the optimizers'
non-float group values and which float ones are zero. A program is then taken only while
the plain Python values the step read (`python_values`) and the hooks it ran (`hooks`)
are as they were at its capture. Float hyperparameters are inputs, so a changed learning
rate reuses the program. A call dispatches the program and returns at once: state,
gradients and returned tensors stay on the device as `DeviceTensor`s until something
reads them.
"""
import functools
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

import wafer
from bridge.convert import put_global, tensor_to_input, to_jax_dtype
from bridge.device_tensor import Absent, DeviceTensor, unpack
from cstorch.backend import current_or_cpu_backend
from cstorch.backends import csx
from cstorch.distributed.process_group import global_inputs
from cstorch.optim.optimizer import group_writes
from cstorch.tracing import index_check, micro_batch, python_values
from cstorch.tracing.arguments import fingerprint, split_call
from cstorch.tracing.changes import describe_graph_change, describe_key_change
from cstorch.tracing.capture import Program, capture_program, capturing
from cstorch.utils.data.executor import (defer_checkpoint_closure, defer_step_closure,
                                         is_checkpoint_step, note_step_output,
                                         runs_step_closures)


log = logging.getLogger("cstorch")
_PLAIN = (bool, int, str, type(None))
# A Python value that has changed the program this many times is worth a warning.
VALUE_CAPTURES_WARNED = 3
_noticed: set = set()


def put(host: np.ndarray, sharding):
    """A host value as a device array laid out by `sharding` (which may span processes)."""
    if sharding.is_fully_addressable:
        return jax.device_put(host, sharding)
    return put_global(host, sharding)


def _notice(message: str):
    """A one-line notice on stderr, once per message."""
    if message not in _noticed:
        _noticed.add(message)
        print(f"cstorch: {message}", file=sys.stderr)


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


def _check_values(state):
    missing = state.absent()
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise RuntimeError(
            f"cannot run the step: the backend was created with drop_data=True and these state "
            f"tensors have no value: {shown}. Load a checkpoint with values for every state "
            f"tensor first, e.g. state = cstorch.load(path); model.load_state_dict(state['model']); "
            f"optimizer.load_state_dict(state['optimizer'])")
    # Values are only ever added back (loads are kept): once complete, the same layout
    # needs no second look.
    state.complete_at = state.version


class TracedStep:
    """The callable `@cstorch.trace` returns."""

    def __init__(self, step_fn: Callable):
        functools.update_wrapper(self, step_fn)
        self.step_fn = step_fn
        self.programs: dict = {}   # key -> [Program], told apart by their gradient rules
        self.captures = 0
        self._hyper_cache = (None, None, None)   # (mesh, group values, device vector)
        self._groups_cache = None
        self._last = None   # (key, programs) of the last call
        self._rng_placeholder = (None, None)     # (mesh, device array)
        self.recaptures: list = []   # why each capture after the first happened
        self._value_captures: dict = {}   # Python value's name -> captures it caused
        self._warned_input_grad = False

    @property
    def name(self):
        return getattr(self.step_fn, "__name__", "step")

    def __get__(self, obj, objtype=None):
        """`@cstorch.trace` on a method (Model Zoo's `Trainer.training_step`): read from an
        instance, the step bound to that instance, with its own programs. The instance
        keeps it (in its `__dict__`), so every later read finds the same step."""
        bind = getattr(type(self.step_fn), "__get__", None)
        if obj is None or bind is None:
            return self
        attrs = getattr(obj, "__dict__", None)
        steps = attrs.setdefault("_cstorch_traced_steps", {}) if attrs is not None else {}
        bound = steps.get(id(self))
        if bound is None:
            bound = steps[id(self)] = TracedStep(bind(self.step_fn, obj, objtype))
        return bound

    def _key(self, backend, call):
        """What the program for this call depends on, and the float hyperparameters' values."""
        state = backend.state
        static, values = self._groups(backend)
        key = (call.key, state.version, tuple([m.training for m in state.modules()]),
               state.requires_grad_key(), static, micro_batch.key(backend, self.name),
               backend.precision_level, csx.debug.check_finite, index_check.enabled(backend),
               # torch's own settings the capture follows, as eager PyTorch would
               (torch.get_default_dtype(),
                torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")),
               csx.performance.scan_blocks)
        return key, values

    def _groups(self, backend):
        """(what programs depend on, float values) of the optimizers' param groups, looked
        at again only after a write to a group (`ParamGroup`), a new list of groups, or
        every call while a group holds a mutable value (a set of tags, ...)."""
        stamp = (group_writes(), [id(opt.param_groups) for opt in backend.optimizers])
        cached = self._groups_cache
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
        values, static, mutable = [], [], False
        for opt in backend.optimizers:
            for group in opt.param_groups:
                for k, v in group.items():
                    kind = type(v)
                    if kind is float:
                        values.append(v)
                        static.append((k, _float_is_zero(v)))
                    elif kind in _PLAIN:
                        static.append((k, (kind, v)))
                    elif kind is tuple:
                        for x in v:
                            if type(x) is float:
                                values.append(x)
                                static.append((k, _float_is_zero(x)))
                            else:
                                static.append((k, fingerprint(x)))
                                mutable = mutable or type(x) not in _PLAIN
                    elif k != "params" and not isinstance(v, torch.Tensor):
                        static.append((k, fingerprint(v)))
                        mutable = True
        static = tuple(static)
        self._groups_cache = None if mutable else (stamp, static, values)
        return static, values

    def _program(self, backend, call):
        key, values = self._key(backend, call)
        state = backend.state
        if backend.retrace_every_iteration:
            candidates = []
        elif self._last is not None and self._last[0] == key:
            candidates = self._last[1]   # the same key as the last call: no dict lookup
        else:
            candidates = self.programs.setdefault(key, [])
        stale = moved = None
        for program in candidates:
            if all(_has_grad(state, i) == present for i, present in program.grad_rule.items()):
                stale = program.constants_changed() if program.constants else None
                if stale is not None:
                    candidates.remove(program)   # it computes with the tensor's old value
                    break
                # A new program is judged against the latest one a change set aside: the
                # one most like it, and the change its reason gives.
                change = python_values.first_change(program.python_values)
                if change is not None:   # it was captured with another value of it
                    name, before, now = change
                    moved = (program, candidates, name, (
                        f"{name} changed from {python_values.describe(before)} to "
                        f"{python_values.describe(now)}"))
                    continue
                if program.hooks is not None and program.hooks.changed():
                    moved = (program, candidates, None, (
                        "a hook the step runs (a module's forward or backward hook, a "
                        "parameter's gradient hook, an optimizer's step hook) was registered "
                        "or removed"))
                    continue
                self._last = (key, candidates)
                return program, values
        previous = self._last
        if stale is not None:
            reason = (f"a tensor of shape {tuple(stale.shape)} that the step closes over (not "
                      f"an argument) was written in place or given new data since the capture")
            warnings.warn(f"cstorch: {self.name}: {reason}; capturing it again, so that the "
                          f"step computes with its new value. Pass the tensor to the step as "
                          f"an argument, and a new value needs no new capture.", stacklevel=3)
        program = capture_program(self.step_fn, backend, call, self.name)
        self.captures += 1
        # Registering modules during capture changes the state layout: key by the result.
        key, values = self._key(backend, call)
        if backend.retrace_every_iteration:
            self._log_graph_change(previous, program)
            self.programs[key] = [program]   # one program per key: a long run keeps no history
        else:
            if stale is not None:
                self.recaptures.append([reason])
            elif moved is not None:
                self._value_recapture(moved, program)
            elif previous is not None:
                self._log_recapture(previous[0], key)
            self.programs.setdefault(key, []).append(program)
        self._last = (key, self.programs[key])
        return program, values

    def _value_recapture(self, moved, program):
        """A Python value or the modules' hooks changed since `old` was captured. If the
        new program computes just as `old` did, the change does not matter to it: it
        replaces `old`, and does not watch the values that changed."""
        old, candidates, name, reason = moved
        if old.computes_like(program):
            changed = set(python_values.changes(old.python_values))
            kept = {w[1] for w in old.python_values} - changed
            program.python_values = tuple(w for w in program.python_values if w[1] in kept)
            if old in candidates:
                candidates.remove(old)
            log.info("cstorch: %s captured again (program %d), which left the program the "
                     "same: %s%s", self.name, self.captures, reason,
                     f"; {', '.join(sorted(changed))} no longer watched" if changed else "")
            return
        self.recaptures.append([reason])
        log.info("cstorch: %s captured again (program %d): %s", self.name, self.captures, reason)
        if name is None:
            return
        count = self._value_captures[name] = self._value_captures.get(name, 0) + 1
        if count == VALUE_CAPTURES_WARNED:
            warnings.warn(
                f"cstorch: {self.name}: {name} has changed the captured program {count} times, "
                f"and every new value captures and compiles the step again (seconds each). Hold "
                f"a value that changes during training in a tensor (a buffer of the module, or "
                f"a step argument), which reaches the program as an input.", stacklevel=4)

    def _log_recapture(self, old_key, new_key):
        reasons = describe_key_change(old_key, new_key)
        self.recaptures.append(reasons)
        log.info("cstorch: %s captured again (program %d): %s", self.name, self.captures,
                 "; ".join(reasons))

    def _log_graph_change(self, previous, program):
        if previous is None or not previous[1]:
            return
        old, new = previous[1][-1].graph.code, program.graph.code
        if old != new:
            lines = describe_graph_change(old, new)
            self.recaptures.append(lines)
            log.warning("cstorch: the graph of %s changed at capture %d:\n%s", self.name,
                        self.captures, "\n".join(lines))

    def _hyper_array(self, program, values, backend):
        """The hyperparameter vector, on the device: uploaded only when a value changed."""
        mesh, cached_values, cached = self._hyper_cache
        if values is cached_values and mesh is backend.mesh:  # the list `_groups` returned last time
            return cached
        wanted = [v for v in values if v != 0]
        if mesh is not backend.mesh or [v for v in cached_values if v != 0] != wanted:
            cached = put(np.asarray(wanted + [1 - v for v in wanted], np.float32),
                         wafer.replicated(backend.mesh))
        self._hyper_cache = (backend.mesh, values, cached)
        return cached

    @staticmethod
    def _rng(backend):
        pair = _rng(backend)
        return put(pair, wafer.replicated(backend.mesh)) if backend.distributed else pair

    def _no_rng(self, backend):
        """A constant stand-in for programs that draw no random numbers."""
        mesh, placeholder = self._rng_placeholder
        if mesh is not backend.mesh:
            placeholder = put(np.zeros(2, np.uint32), wafer.replicated(backend.mesh))
            self._rng_placeholder = (backend.mesh, placeholder)
        return placeholder

    def __call__(self, *args, **kwargs):
        if capturing.get() is not None:
            return self.step_fn(*args, **kwargs)
        backend = current_or_cpu_backend()
        state = backend.state
        state.sync()
        call = split_call(args, kwargs)
        program, values = self._program(backend, call)
        if not backend.executes:
            return self._not_executed(program, backend)
        if backend.drops_data == "drop_data" and state.complete_at != state.version:
            _check_values(state)
        index_check.raise_pending(wait=False)
        if program.unread_grads:
            grads_in = _grad_arguments(state, program)
        else:
            grads_in = [_grad_param(state, i).grad_array() for i in program.grad_inputs]
        tensors = call.tensors
        if not self._warned_input_grad and any([t.requires_grad for t in tensors]):
            self._warn_input_grad(tensors)
        inputs = [tensor_to_input(t) for t in tensors]
        if backend.distributed:
            inputs = global_inputs(inputs, program.compiled.input_shardings,
                                   backend.process_count)
        new_state, grads, outs = program.compiled(
            state.arrays_list, grads_in, self._hyper_array(program, values, backend),
            inputs, self._rng(backend) if program.uses_rng else self._no_rng(backend))
        state.arrays_list[:] = new_state
        backend.step_count += 1
        if program.index_checks is not None:
            outs = list(outs)
            index_check.note(outs.pop(), program.index_checks, self.name, backend.step_count)
        if program.finite_check is not None:
            outs = list(outs)
            _report_non_finite(outs.pop(), program)
        if state.grads_from is not program or program.grads_bound != state.version:
            _bind_grads(state, program)
        program.grad_source.publish(grads)
        values = [DeviceTensor.of(a, dt, shape)
                  for a, dt, shape in zip(outs, program.out_dtypes, program.out_shapes)]
        for k, cell in program.held_results:
            values[k] = _held_tensor(state, cell)
        if program.closures:
            self._run_closures(program, values[len(program.results.positions):])
        results = program.results.rebuild(values)
        note_step_output(results)
        return results

    def _warn_input_grad(self, tensors):
        """Eager PyTorch would fill an argument's `.grad` (or backpropagate into the graph
        it came from); a program takes its arguments as values."""
        self._warned_input_grad = True
        which = [i for i, t in enumerate(tensors) if t.requires_grad]
        warnings.warn(
            f"cstorch: {self.name}: the argument tensor(s) at position(s) {which} of the step's "
            f"flattened arguments require grad, but a traced step takes its arguments as "
            f"values: no gradient reaches them (their .grad is left as it was, and the graph "
            f"they were computed by is not backpropagated into). To differentiate with "
            f"respect to an input, call requires_grad_() on it inside the step and use "
            f"torch.autograd.grad or its .grad there; pass x.detach() to silence this.",
            stacklevel=3)

    def _not_executed(self, program, backend):
        """A compile_only or validate_only call: the program was made, nothing runs. The
        results are tensors without values; closures that would read values are skipped."""
        mode = "compile_only" if backend.params.get("compile_only") else "validate_only"
        reason = f"the backend is {mode}, so steps are not executed"
        values = [DeviceTensor.of(Absent(shape, to_jax_dtype(dt), None, None, reason), dt, shape)
                  for dt, shape in zip(program.out_dtypes, program.out_shapes)]
        for call in program.closures:
            if call.tensor_positions:
                _notice(f"{mode}: step closure {getattr(call.fn, '__qualname__', call.fn)!r} "
                        f"skipped, it reads values that are not computed")
            elif not call.checkpoint_only or is_checkpoint_step():
                args, kwargs = pytree.tree_unflatten(list(call.leaves), call.spec)
                call.fn(*args, **kwargs)
        return program.results.rebuild(values)

    @staticmethod
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

    # JAX-native access ----------------------------------------------------------------
    def to_jax(self, *args, **kwargs) -> "JaxStep":
        """The pure JAX function of this step for these arguments, with the current state.

        Captures the step if it has not been captured for arguments like these; runs nothing.
        """
        backend = current_or_cpu_backend()
        backend.state.sync()
        call = split_call(args, kwargs)
        program, values = self._program(backend, call)
        state = backend.state
        named = dict(zip(program.names, (c.array for c in state.cells)))
        for i in program.grad_inputs:
            named[f"{program.names[i]}.grad"] = _grad_param(state, i).grad_array()
        for (o, g, key, index), value in zip(program.hyper, [v for v in values if v != 0]):
            named[_hyper_name(backend, o, g, key, index)] = np.float32(value)
        return JaxStep(program, named, [tensor_to_input(t) for t in call.tensors],
                       _rng(backend), backend)


def _float_is_zero(value: float) -> tuple:
    """A float hyperparameter's part of a program key. The program takes the value as an
    input, but whether it is zero shapes the graph (a zero weight decay is left out). Tagged,
    so that it never equals an int or bool's part: `(k, False) == (k, 0)`, and an int 0
    changed to a float 0.1 would otherwise reuse a program that has no input for it."""
    return (float, value == 0)


def _hyper_name(backend, o, g, key, index):
    opt = backend.optimizers[o]
    return f"{opt._prefix}.param_groups.{g}.{key}" + ("" if index is None else f".{index}")


def _grad_param(state, cell):
    """The parameter (a device tensor requiring grad) held in `cell`, or None."""
    for e in state.entries:
        if e.cell == cell and e.tensor.requires_grad:
            return e.tensor
    return None


def _held_tensor(state, cell):
    """The tensor (a parameter, a buffer, an optimizer state tensor) held in `cell`."""
    return next(e.tensor for e in state.entries if e.cell == cell)


def _has_grad(state, cell) -> bool:
    param = _grad_param(state, cell)
    return param is not None and param.has_grad()


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
        if k in program.unread_grads:
            if k not in kept:
                kept[k] = _grad_param(state, i).grad_array()
            args.append(kept[k])
        else:
            args.append(_grad_param(state, i).grad_array())
    return args


def _rng(backend):
    """(seed, step): the step's PRNG key is folded from these inside the program, so a
    run is reproducible from `torch.manual_seed` and each step draws new numbers."""
    return np.array([torch.initial_seed() % (2 ** 32), backend.step_count % (2 ** 32)], np.uint32)


@dataclass
class JaxStep:
    """A traced step as plain JAX.

    ``fn(state, inputs, rng) -> (new_state, outputs)`` is a pure function of JAX arrays:
    `state` maps each state tensor's name (``model.0.weight``,
    ``optimizer.state.0.momentum_buffer``), each gradient the step reads (``model.0.weight.grad``)
    and each float hyperparameter (``optimizer.param_groups.0.lr``) to its array; `inputs`
    is the list of the call's tensor arguments in flattening order, `rng` a uint32 pair
    (seed, step) random ops draw their key from. `new_state` has the same names, with the
    gradients the step leaves as ``NAME.grad``. Call it under `jax.jit`, `jax.grad`,
    `jax.make_jaxpr` or anything else JAX offers.
    """
    program: Program
    state: dict
    inputs: list
    rng: Any
    backend: Any

    def fn(self, state: dict, inputs, rng):
        p = self.program
        names = p.names
        hyper_names = [_hyper_name(self.backend, *h) for h in p.hyper]
        values = [jax.numpy.asarray(state[n], jax.numpy.float32) for n in hyper_names]
        # The compiled step gets complements computed in double precision on the host;
        # here they follow the (possibly traced) values.
        hyper = jax.numpy.stack(values + [1 - v for v in values]) if values \
            else jax.numpy.zeros(0, jax.numpy.float32)
        new_state, grads, outs = p.jax_fn(
            [state[n] for n in names], [state[f"{names[i]}.grad"] for i in p.grad_inputs],
            hyper, list(inputs), rng)
        result = dict(zip(names, new_state))
        if p.grad_layout is not None:
            grads = [unpack((grads[f], offset, shape)) for f, offset, shape in p.grad_layout]
        result.update({f"{names[i]}.grad": g for i, g in zip(p.grad_outputs, grads)})
        result.update({n: state[n] for n in hyper_names})
        checks = (p.finite_check is not None) + (p.index_checks is not None)
        return result, outs[:len(outs) - checks]

    @property
    def args(self):
        """(state, inputs, rng): the arguments that reproduce the step as it would run now."""
        return self.state, self.inputs, self.rng

    def stablehlo(self, debug_info: bool = True) -> str:
        """The StableHLO text of the step. With `debug_info`, each op's location names the
        ATen op and the line of model code it comes from."""
        return jax.jit(self.fn).lower(*self.args).as_text(debug_info=debug_info)

    def jaxpr(self):
        return jax.make_jaxpr(self.fn)(*self.args)
