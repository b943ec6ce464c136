"""Compile a step's JAX function for a mesh, and write what the compiler made of it."""
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax

from wafer.cache import counted, stats
from wafer.layout import batch_sharding, replicated, state_sharding


@dataclass
class CompiledStep:
    """An XLA executable of ``fn(state, grads, hyper, inputs, rng) -> (state, grads, outputs)``."""
    executable: Any
    traced: Any
    lowered: Any
    input_shardings: list   # of the call's tensor inputs

    def __call__(self, *args):
        if self.executable is None:
            raise RuntimeError("this step was lowered but not compiled (a validate_only "
                               "backend); it cannot run")
        return self.executable(*args)

    def jaxpr(self):
        return self.traced.jaxpr


def compile_step(fn: Callable, args, *, mesh, artifact_dir: str | None = None,
                 name: str = "step", compile: bool = True,
                 replicate_outputs: bool = False) -> CompiledStep:
    """Jit `fn` for `mesh` and compile it ahead of time, so later calls never retrace.

    `args` are example arguments ``(state, grads, hyper, inputs, rng)`` (arrays, or
    `jax.ShapeDtypeStruct`s with a sharding): state and gradients (lists) are laid over
    the grid (the old state donated), the hyperparameter vector and the PRNG pair
    replicated, inputs split over the batch. With `replicate_outputs` (a mesh that spans
    processes) gradients and outputs are replicated, so every process holds all of both.
    One trace gives the jaxpr, the lowering and
    the executable, and the artifacts written from them. Without `compile` the step is
    only lowered (no XLA compilation, no executable).
    """
    state, grads, hyper, inputs, rng = args
    state_sh = [state_sharding(mesh, tuple(a.shape)) for a in state]
    grad_sh = [state_sharding(mesh, tuple(a.shape)) for a in grads]
    input_sh = [batch_sharding(mesh, tuple(getattr(x, "shape", ()))) for x in inputs]
    out_sh = None
    if replicate_outputs:
        out_sh = replicated(mesh)
        grad_sh = [out_sh] * len(grads)   # gradients come back in as they went out
    jitted = jax.jit(fn, in_shardings=(state_sh, grad_sh, replicated(mesh), input_sh,
                                       replicated(mesh)),
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
    return CompiledStep(executable, traced, lowered, input_sh)


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
