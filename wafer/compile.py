"""Compile a step's JAX function for a mesh, and write what the compiler made of it."""
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax

from wafer.cache import counted, stats
from wafer.layout import batch_sharding, replicated, state_sharding


@dataclass
class CompiledStep:
    """An XLA executable of ``fn(state, grads, hyper, inputs, rng) -> (state, grads, outputs)``.

    With `kept` (indices of state arrays that are not donated), the executable takes and
    returns the donated state arrays and the kept ones as two lists; a call takes and
    returns the state as one list all the same."""
    executable: Any
    traced: Any
    lowered: Any
    input_shardings: list   # of the call's tensor inputs
    kept: tuple = ()

    def __call__(self, state, *rest):
        if self.executable is None:
            raise RuntimeError("this step was lowered but not compiled (a validate_only "
                               "backend); it cannot run")
        if not self.kept:
            return self.executable(state, *rest)
        donated, kept = _split(state, self.kept)
        new_donated, new_kept, grads, outs = self.executable(donated, kept, *rest)
        return _merge(new_donated, new_kept, self.kept), grads, outs

    def jaxpr(self):
        return self.traced.jaxpr


def compile_step(fn: Callable, args, *, mesh, artifact_dir: str | None = None,
                 name: str = "step", compile: bool = True,
                 replicate_outputs: bool = False, kept: Sequence[int] = ()) -> CompiledStep:
    """Jit `fn` for `mesh` and compile it ahead of time, so later calls never retrace.

    `args` are example arguments ``(state, grads, hyper, inputs, rng)`` (arrays, or
    `jax.ShapeDtypeStruct`s with a sharding): state and gradients (lists) are laid over
    the grid (the old state donated, except the arrays whose indices are in `kept`), the
    hyperparameter vector and the PRNG pair replicated, inputs split over the batch. With
    `replicate_outputs` (a mesh that spans processes) gradients and outputs are
    replicated, so every process holds all of both. One trace gives the jaxpr, the
    lowering and the executable, and the artifacts written from them. Without `compile`
    the step is only lowered (no XLA compilation, no executable).
    """
    state, grads, hyper, inputs, rng = args
    state_sh = [state_sharding(mesh, tuple(a.shape)) for a in state]
    grad_sh = [state_sharding(mesh, tuple(a.shape)) for a in grads]
    input_sh = [batch_sharding(mesh, tuple(getattr(x, "shape", ()))) for x in inputs]
    out_sh = None
    if replicate_outputs:
        out_sh = replicated(mesh)
        grad_sh = [out_sh] * len(grads)   # gradients come back in as they went out
    rest_sh = (grad_sh, replicated(mesh), input_sh, replicated(mesh))
    kept = tuple(sorted(kept))
    if kept:
        fn, args = _kept_apart(fn, kept), (*_split(state, kept), *args[1:])
        state_sh = _split(state_sh, kept)
        jitted = jax.jit(fn, in_shardings=(*state_sh, *rest_sh),
                         out_shardings=(*state_sh, out_sh, out_sh), donate_argnums=(0,))
    else:
        jitted = jax.jit(fn, in_shardings=(state_sh, *rest_sh),
                         out_shardings=(state_sh, out_sh, out_sh), donate_argnums=(0,))
    start = time.perf_counter()
    traced = jitted.trace(*args)
    lowered = traced.lower()
    stats.lowering_seconds += time.perf_counter() - start
    executable = None
    if compile:
        with counted():
            executable = lowered.compile(compiler_options=compiler_options(mesh))
    if artifact_dir:
        start = time.perf_counter()
        write_artifacts(traced, lowered, executable, artifact_dir, name)
        stats.artifact_seconds += time.perf_counter() - start
    return CompiledStep(executable, traced, lowered, input_sh, kept)


def _split(state, kept):
    """(the arrays not in `kept`, the arrays in `kept`), each in index order."""
    kept_set = set(kept)
    return [a for i, a in enumerate(state) if i not in kept_set], [state[i] for i in kept]


def _merge(donated, kept_arrays, kept):
    state = list(donated)
    for i, a in zip(kept, kept_arrays):
        state.insert(i, a)
    return state


def _kept_apart(fn, kept):
    """`fn` taking and returning the donated and the kept state arrays as two lists.
    JAX gives a donated input's buffer to the first output of its shape and dtype that has
    none yet, so the donated arrays' new values come first, in their inputs' order: each
    gets its own input's buffer, and the kept arrays' new values get fresh ones."""
    def apart(donated, kept_arrays, *rest):
        state, grads, outs = fn(_merge(donated, kept_arrays, kept), *rest)
        return (*_split(state, kept), grads, outs)
    return apart


def compiler_options(mesh) -> dict:
    """XLA options for a step compiled for `mesh`'s devices.

    On a GPU, XLA's Triton matmul fusions are turned off: autotuning them took 115 s of a
    gpt-small step's 119 s first step on an H200 (cuBLAS alone: 10 s to compile, a step as
    fast: 3.85 against 3.94 ms). A user who names the option in XLA_FLAGS keeps their own."""
    platform = mesh.devices.flat[0].platform
    if platform in ("gpu", "cuda", "rocm") and \
            "xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
        return {"xla_gpu_enable_triton_gemm": False}
    return {}


def write_artifacts(traced, lowered, executable, artifact_dir: str, name: str):
    """jaxpr, StableHLO, optimised HLO and cost/memory analysis of one compiled step."""
    os.makedirs(artifact_dir, exist_ok=True)
    path = lambda ext: os.path.join(artifact_dir, f"{name}.{ext}")  # noqa: E731
    with open(path("jaxpr.txt"), "w") as f:
        f.write(str(traced.jaxpr))
    with open(path("stablehlo.mlir"), "w") as f:
        f.write(lowered.as_text(debug_info=True))   # locations name the model's lines
    if executable is None:   # lowered only: nothing compiled to analyse
        return
    with open(path("hlo.txt"), "w") as f:
        f.write(executable.as_text() or "")
    report = {}
    try:
        cost = executable.cost_analysis()
        report["cost"] = cost[0] if isinstance(cost, list) else cost
    except Exception as e:  # not every platform reports costs
        report["cost"] = f"unavailable: {e}"
    try:
        mem = executable.memory_analysis()
        report["memory"] = {k: getattr(mem, k) for k in dir(mem)
                            if k.endswith("_in_bytes") and not k.startswith("_")}
    except Exception as e:
        report["memory"] = f"unavailable: {e}"
    with open(path("analysis.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
