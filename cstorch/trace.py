"""`@cstorch.trace`: capture a step once, run it as one compiled XLA program ever after."""
import contextvars
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.optim.optimizer import register_optimizer_step_pre_hook

import bridge
import wafer
from cstorch.backend import current_backend_impl
from cstorch.optim.optimizer import Optimizer
from cstorch.utils.data.executor import is_checkpoint_step

VALUE_READ_HINT = ("To look at a tensor's value, pass it to a function decorated with "
                   "@cstorch.step_closure, which runs after the step with the computed values.")

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
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self.closure_tensors.extend(leaves[i] for i in positions)
        kept = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self.closures.append(ClosureCall(fn, spec, kept, positions, checkpoint_only))


@dataclass
class Program:
    """One captured and compiled step: its graph, JAX function and executable."""
    graph: Any
    jax_fn: Callable                     # fn(state, inputs, rng) -> (new_state, outputs)
    compiled: Any
    n_state: int
    state_names: list
    out_spec: Any
    out_leaves: list                     # non-tensor output leaves, tensors as None
    out_tensor_positions: list
    out_dtypes: list                     # torch dtype of every tensor output
    closures: list


def _refuse_torch_optimizer(optimizer, args, kwargs):
    if isinstance(optimizer, Optimizer):
        return
    # torch's optimizers create their state lazily inside the step and hold the module's
    # own parameters, not the traced ones: under trace they would silently update nothing.
    name = type(optimizer).__name__
    raise TypeError(
        f"a torch.optim.{name} is used in a traced step; traced steps need optimizers whose "
        f"state exists before the first step: use cstorch.optim.{name} "
        f"(from cerebras.pytorch.optim) instead")


class TracedStep:
    """The callable `@cstorch.trace` returns."""

    def __init__(self, step_fn: Callable):
        functools.update_wrapper(self, step_fn)
        self.step_fn = step_fn
        self.programs: dict = {}
        self.captures = 0

    # signature of a call: which program it runs ---------------------------------------
    @staticmethod
    def _signature(backend, spec, leaves):
        """What a captured program depends on besides state values: the arguments' tree,
        tensor shapes and dtypes, Python values and objects, module train/eval modes and
        the optimizers' Python hyperparameters (a changed float lr is a new program)."""
        args = tuple(
            ("T", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor)
            else ("V", v) if isinstance(v, (int, float, str, bool, type(None)))
            else ("O", id(v)) for v in leaves)
        modes = tuple(m.training for module in backend.modules for m in module.modules())
        hyper = tuple(
            tuple((k, v) for k, v in group.items()
                  if k != "params" and isinstance(v, (int, float, str, bool, type(None), tuple)))
            for opt in backend.optimizers for group in opt.raw_param_groups)
        return spec, args, modes, hyper, len(backend.state.slots)

    def _capture(self, backend, leaves, spec, tensors) -> Program:
        for leaf in leaves:
            if isinstance(leaf, torch.optim.Optimizer) and not isinstance(leaf, Optimizer):
                _refuse_torch_optimizer(leaf, None, None)
        state = backend.state
        for opt in Optimizer.registered(backend):
            opt.register_state(state)
        slots = list(state.slots)
        n_state = len(slots)
        ctx = CaptureContext()
        tensor_positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        out_info = {}

        def step(*flat):
            traced_state, traced_inputs = flat[:n_state], flat[n_state:]
            call_leaves = list(leaves)
            for pos, t in zip(tensor_positions, traced_inputs):
                call_leaves[pos] = t
            args, kwargs = pytree.tree_unflatten(call_leaves, spec)
            with _bound(backend, slots, traced_state) as current:
                token = capturing.set(ctx)
                try:
                    result = self.step_fn(*args, **kwargs)
                finally:
                    capturing.reset(token)
                new_state = current()
            out_leaves, out_spec = pytree.tree_flatten(result)
            positions = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
            out_info.update(spec=out_spec, positions=positions,
                            leaves=[None if isinstance(v, torch.Tensor) else v for v in out_leaves])
            outs = [out_leaves[i] for i in positions] + list(ctx.closure_tensors)
            out_info["dtypes"] = [t.dtype for t in outs]
            return list(new_state) + outs

        requires_grad = [s.tensor.requires_grad for s in slots] + [False] * len(tensors)
        state.capturing = True
        # Also catches a torch optimizer the step reaches through a closure or global.
        hook = register_optimizer_step_pre_hook(_refuse_torch_optimizer)
        try:
            graph = bridge.capture(step, [s.tensor for s in slots] + tensors, requires_grad,
                                   value_read_hint=VALUE_READ_HINT)
        except bridge.TensorValueReadError as e:
            raise RuntimeError(str(e)) from None
        finally:
            hook.remove()
            state.capturing = False
        self.captures += 1
        lowered = bridge.lower(graph)

        def jax_fn(state_arrays, inputs, rng):
            seed, step_index = rng[0], rng[1]
            key = jax.random.fold_in(jax.random.PRNGKey(seed), step_index)
            outs = lowered(*state_arrays, *inputs, key=key)
            return list(outs[:n_state]), list(outs[n_state:])

        state_arrays = state.device_arrays()
        inputs = self._inputs(backend, tensors)
        compiled = wafer.compile_step(jax_fn, state_arrays, inputs, self._key(backend), mesh=backend.mesh,
                                      artifact_dir=backend.artifact_dir,
                                      name=getattr(self.step_fn, "__name__", "step"))
        return Program(graph, jax_fn, compiled, n_state, [s.name for s in slots], out_info["spec"],
                       out_info["leaves"], out_info["positions"], out_info["dtypes"], ctx.closures)

    @staticmethod
    def _inputs(backend, tensors):
        return [jax.device_put(bridge.tensor_to_numpy(t), wafer.batch_sharding(backend.mesh, tuple(t.shape)))
                for t in tensors]

    @staticmethod
    def _key(backend):
        """(seed, step): the step's PRNG key is folded from these inside the program, so a
        run is reproducible from `torch.manual_seed` and each step draws new numbers."""
        return np.array([torch.initial_seed() % (2 ** 32), backend.step_count % (2 ** 32)], np.uint32)

    def _program(self, backend, args, kwargs):
        """The program for this call, captured if needed, and the call's tensors."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        signature = self._signature(backend, spec, leaves)
        program = self.programs.get(signature)
        if program is None or backend.retrace_every_iteration:
            program = self._capture(backend, leaves, spec, tensors)
            # Registering optimizer state during capture can add slots; key by the result.
            self.programs[self._signature(backend, spec, leaves)] = program
        return program, tensors

    def __call__(self, *args, **kwargs):
        if capturing.get() is not None:
            return self.step_fn(*args, **kwargs)
        backend = current_backend_impl(create=True)
        program, tensors = self._program(backend, args, kwargs)
        state = backend.state
        new_state, outs = program.compiled(state.device_arrays(), self._inputs(backend, tensors),
                                           self._key(backend))
        state.update(new_state)
        backend.step_count += 1
        host = [bridge.jax_to_tensor(a, dt) for a, dt in zip(outs, program.out_dtypes)]
        n_user = len(program.out_tensor_positions)
        self._run_closures(program, host[n_user:])
        leaves = list(program.out_leaves)
        for pos, t in zip(program.out_tensor_positions, host[:n_user]):
            leaves[pos] = t
        return pytree.tree_unflatten(leaves, program.out_spec)

    @staticmethod
    def _run_closures(program, values):
        it = iter(values)
        for call in program.closures:
            leaves = list(call.leaves)
            for pos in call.tensor_positions:
                leaves[pos] = next(it)
            if call.checkpoint_only and not is_checkpoint_step():
                continue
            args, kwargs = pytree.tree_unflatten(leaves, call.spec)
            call.fn(*args, **kwargs)

    # JAX-native access ----------------------------------------------------------------
    def to_jax(self, *args, **kwargs) -> "JaxStep":
        """The pure JAX function of this step for these arguments, with the current state.

        Captures the step if it has not been captured for arguments like these; runs nothing.
        """
        backend = current_backend_impl(create=True)
        program, tensors = self._program(backend, args, kwargs)
        return JaxStep(program, backend.state.device_arrays(), self._inputs(backend, tensors),
                       self._key(backend))


@dataclass
class JaxStep:
    """A traced step as plain JAX.

    ``fn(state, inputs, rng) -> (new_state, outputs)`` is a pure function of JAX arrays:
    `state` maps each state tensor's name (``model.0.weight``, ``optimizer.state.0.momentum_buffer``)
    to its array, `inputs` is the list of the call's tensor arguments in flattening order,
    `rng` a uint32 pair (seed, step) random ops draw their key from. Call it under `jax.jit`, `jax.grad`,
    `jax.make_jaxpr` or anything else JAX offers.
    """
    program: Program
    state_arrays: list
    inputs: list
    rng: Any

    @property
    def state(self) -> dict:
        return dict(zip(self.program.state_names, self.state_arrays))

    def fn(self, state: dict, inputs, rng):
        names = self.program.state_names
        new_state, outs = self.program.jax_fn([state[n] for n in names], list(inputs), rng)
        return dict(zip(names, new_state)), outs

    @property
    def args(self):
        """(state, inputs, rng): the arguments that reproduce the step as it would run now."""
        return self.state, self.inputs, self.rng

    def stablehlo(self) -> str:
        return jax.jit(self.fn).lower(*self.args).as_text()

    def jaxpr(self):
        return jax.make_jaxpr(self.fn)(*self.args)


class _bound:
    """Point every module attribute and optimizer entry that holds a state tensor at its
    traced stand-in for the duration of a capture, then put the originals back."""

    def __init__(self, backend, slots, traced):
        self.backend, self.slots, self.traced = backend, slots, traced

    def __enter__(self):
        tables = {}
        for module in self.backend.modules:
            for sub in module.modules():
                for kind in ("_parameters", "_buffers"):
                    tables[id(sub.__dict__[kind])] = sub.__dict__[kind]
        self.saved = []  # (table, key, original tensor, slot index)
        for i, (slot, traced) in enumerate(zip(self.slots, self.traced)):
            for location in slot.locations:
                if location[0] in tables:  # a module table; optimizers bind their own
                    table, key = tables[location[0]], location[1]
                    self.saved.append((table, key, dict.__getitem__(table, key), i))
                    dict.__setitem__(table, key, traced)
        self.optimizers = list(Optimizer.registered(self.backend))
        for opt in self.optimizers:
            opt.bind(self.backend.state, self.traced)

        def current():
            values = list(self.traced)
            for table, key, _, i in self.saved:
                values[i] = dict.__getitem__(table, key)
            for opt in self.optimizers:
                opt.collect(self.backend.state, values)
            return values
        return current

    def __exit__(self, *exc):
        for opt in self.optimizers:
            opt.unbind()
        for table, key, value, _ in reversed(self.saved):
            dict.__setitem__(table, key, value)
        return False
