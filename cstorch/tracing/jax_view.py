"""A traced step as plain JAX: `TracedStep.to_jax` gives the pure function of the step
for some arguments, with the run's current state, to call under `jax.jit`, `jax.grad`,
`jax.make_jaxpr` or anything else JAX offers."""
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from bridge.convert import tensor_to_input
from bridge.device_tensor import unpack
from cstorch.tracing.call import rng_pair
from cstorch.tracing.program import Program


def jax_step(program, values, backend, call) -> "JaxStep":
    """The `JaxStep` of `program` for this call, with the run's current state."""
    state = backend.state
    named = dict(zip(program.names, (c.array for c in state.cells)))
    for i in program.grad_inputs:
        named[f"{program.names[i]}.grad"] = state.grad_param(i).grad_array()
    for (o, g, key, index), value in zip(program.hyper, [v for v in values if v != 0]):
        named[_hyper_name(backend, o, g, key, index)] = np.float32(value)
    return JaxStep(program, named, [tensor_to_input(t) for t in call.tensors],
                   rng_pair(backend), backend)


def _hyper_name(backend, o, g, key, index):
    opt = backend.optimizers[o]
    return f"{opt._prefix}.param_groups.{g}.{key}" + ("" if index is None else f".{index}")



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
        slots = p.slots if p.slots is not None else \
            range(len(names)) if p.used is None else p.used
        new_state, grads, outs = p.jax_fn(
            [state[names[s]] if type(s) is int else
             jax.numpy.stack([state[names[i]] for i in s]) for s in slots],
            [state[f"{names[i]}.grad"] for i in p.grad_inputs], hyper, list(inputs), rng)
        result = {n: state[n] for n in names}
        for s, value in zip(slots, new_state):
            if type(s) is int:
                result[names[s]] = value
            else:
                result.update((names[i], value[k]) for k, i in enumerate(s))
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
