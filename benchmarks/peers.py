"""The peers a training workload (benchmarks/workloads) is measured against, built from its
model and batches. Each peer is `run(*batch, read) -> loss` (all positional, as
`benchmarks.mlp_step.one_pass` calls it): one training step, the loss read on the host
when `read`.

- eager: the workload's loss, `backward()` and `torch.optim.<OPTIMIZER>` step.
- torch-compile: the same with the model under `torch.compile` (inductor; on the CPU it
  compiles C++ kernels); the optimizer step stays eager.
- jax: the model written by hand in JAX (the workload's `jax_loss`), one `jax.jit` step
  with the state donated: `jax.value_and_grad` and the same optimizer update (below).
- cstorch: `cstorch.compile(model)` on the CPU backend and a `@cstorch.trace` step with
  `cstorch.optim.<OPTIMIZER>`.
"""
import importlib
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch

import cerebras.pytorch as cstorch

# Several runs in one process, each on a backend of its own: each new backend replaces
# the last, as in the test suite (a user's second backend is refused).
importlib.import_module("cstorch.backend")._replacing_allowed = True

ORDER = ("eager", "torch-compile", "jax", "cstorch")
TITLES = {"eager": "eager PyTorch", "torch-compile": "torch.compile (inductor, CPU)",
          "jax": "hand-written jax.jit", "cstorch": "cstorch traced step (CPU backend)",
          "torchax": "torchax"}


def _torch_step(workload, model, optimizer):
    def run(*args):
        *batch, read = args
        loss = workload.loss(model, *batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if read:
            loss.item()
        return loss
    return run


def eager(workload, model):
    name, kwargs = workload.OPTIMIZER
    return _torch_step(workload, model, getattr(torch.optim, name)(model.parameters(), **kwargs))


def torch_compile(workload, model):
    name, kwargs = workload.OPTIMIZER
    optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)
    return _torch_step(workload, torch.compile(model), optimizer)


# Where the cstorch peer's backend writes its artifacts (the optimised HLO among them).
CSTORCH_ARTIFACTS = os.path.join(tempfile.gettempdir(), "cstorch_bench_logs")


def cstorch_step(workload, model, backend_type="CPU", artifact_dir=CSTORCH_ARTIFACTS):
    """The traced step itself, taking the batch's tensors as arguments."""
    cstorch.backend(backend_type, artifact_dir=artifact_dir)
    compiled = cstorch.compile(model)
    name, kwargs = workload.OPTIMIZER
    optimizer = getattr(cstorch.optim, name)(model.parameters(), **kwargs)

    @cstorch.trace
    def step(*batch):
        loss = workload.loss(compiled, *batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    step.optimizer = optimizer
    return step


def cstorch_peer(workload, model):
    return reading(cstorch_step(workload, model))


def reading(step):
    """`step` as a peer: `run(*batch, read)`."""
    def run(*args):
        *batch, read = args
        loss = step(*batch)
        if read:
            loss.item()
        return loss
    return run


# JAX optimizers with torch.optim's math --------------------------------------------------
def sgd(lr, momentum=0.0):
    """torch.optim.SGD without dampening or weight decay: buf = momentum * buf + g (the
    first step's buf is g), p -= lr * buf."""
    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(params, grads, bufs):
        bufs = jax.tree.map(lambda b, g: momentum * b + g, bufs, grads)
        return jax.tree.map(lambda p, b: p - lr * b, params, bufs), bufs
    return init, update


def adamw(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """torch.optim.AdamW: decoupled decay p *= 1 - lr * wd, then the bias-corrected Adam
    step lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    b1, b2 = betas

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return (jnp.zeros((), jnp.float32), zeros, jax.tree.map(jnp.zeros_like, params))

    def update(params, grads, state):
        t, m, v = state
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** t, jnp.sqrt(1 - b2 ** t)

        def one(p, m, v):
            p = p * (1 - lr * weight_decay)
            return p - (lr / c1) * m / (jnp.sqrt(v) / c2 + eps)
        return jax.tree.map(one, params, m, v), (t, m, v)
    return init, update


JAX_OPTIMIZERS = {"SGD": sgd, "AdamW": adamw}


def _jax_input(t: torch.Tensor):
    a = t.numpy()
    return a.astype(np.int32) if a.dtype == np.int64 else a


def jax_step(workload):
    """The jitted step `step(state, *batch) -> (state, loss)` (state donated), and its
    initial-state function of the torch model."""
    name, kwargs = workload.OPTIMIZER
    opt_init, opt_update = JAX_OPTIMIZERS[name](**kwargs)

    def step(state, *batch):
        params, buffers, opt_state = state
        (loss, buffers), grads = jax.value_and_grad(workload.jax_loss, has_aux=True)(
            params, buffers, *batch)
        params, opt_state = opt_update(params, grads, opt_state)
        return (params, buffers, opt_state), loss

    def init(model):
        params, buffers = jax.tree.map(jnp.asarray, workload.jax_init(model))
        return params, buffers, opt_init(params)
    return jax.jit(step, donate_argnums=(0,)), init


def jax_peer(workload, model):
    step, init = jax_step(workload)
    state = [init(model)]

    def run(*args):
        *batch, read = args
        state[0], loss = step(state[0], *[_jax_input(t) for t in batch])
        if read:
            float(loss)
        return loss
    return run


MAKERS = {"eager": eager, "torch-compile": torch_compile, "jax": jax_peer, "cstorch": cstorch_peer}
