"""Compile a step's JAX function for a mesh, and write what the compiler made of it."""
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional
from collections.abc import Callable, Sequence

import jax

from wafer import artifact_writer
from wafer.cache import cache_hits, counted, stats
from wafer.layout import batch_sharding, replicated, state_sharding


@dataclass
class CompiledStep:
    """An XLA executable of ``fn(state, grads, hyper, inputs, rng) -> (state, grads, outputs)``.

    With `split` (some state arrays are not donated), the executable takes and returns
    the donated state arrays and the kept ones as two lists; a call takes and returns the
    state as one list all the same."""
    executable: Any
    traced: Any
    lowered: Any
    input_shardings: list   # of the call's tensor inputs
    split: Optional["StateSplit"] = None
    input_shapes: list = ()   # of the call's tensor inputs
    from_cache: bool = False   # whether the executable was read from the persistent cache
    compiler_options: dict = None

    @property
    def kept(self) -> tuple:
        """Indices of the state arrays that are not donated."""
        return self.split.kept if self.split is not None else ()

    def __call__(self, state, *rest):
        if self.executable is None:
            raise RuntimeError("this step was lowered but not compiled (a validate_only "
                               "backend); it cannot run")
        if self.split is None:
            return self.executable(state, *rest)
        new_donated, new_kept, grads, outs = self.executable(*self.split.apart(state), *rest)
        return self.split.together(new_donated, new_kept), grads, outs

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
    split = StateSplit(len(state), kept) if kept else None
    if split is not None:
        fn, args = _kept_apart(fn, split), (*split.apart(state), *args[1:])
        state_sh = split.apart(state_sh)
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
    hits = cache_hits()
    if compile:
        with counted():
            executable = lowered.compile(compiler_options=compiler_options(mesh))
    if artifact_dir:
        artifact_writer.defer(
            lambda: write_artifacts(traced, lowered, executable, artifact_dir, name),
            f"the jaxpr, StableHLO and HLO of {name} in {artifact_dir}")
    return CompiledStep(executable, traced, lowered, input_sh, split,
                        [tuple(getattr(x, "shape", ())) for x in inputs],
                        from_cache=cache_hits() != hits, compiler_options=compiler_options(mesh))


class StateSplit:
    """The state list taken apart into the donated arrays and the kept ones, each in index
    order, and put back together. Every call of a step does both, so the index lists are
    worked out once."""

    def __init__(self, n: int, kept: Sequence[int]):
        kept_set = set(kept)
        self.kept = tuple(sorted(kept_set))
        self.donated = tuple(i for i in range(n) if i not in kept_set)

    def apart(self, state) -> tuple:
        return [state[i] for i in self.donated], [state[i] for i in self.kept]

    def together(self, donated, kept_arrays) -> list:
        state = [None] * (len(self.donated) + len(self.kept))
        for i, a in zip(self.donated, donated):
            state[i] = a
        for i, a in zip(self.kept, kept_arrays):
            state[i] = a
        return state


def _kept_apart(fn, split: StateSplit):
    """`fn` taking and returning the donated and the kept state arrays as two lists.
    JAX gives a donated input's buffer to the first output of its shape and dtype that has
    none yet, so the donated arrays' new values come first, in their inputs' order: each
    gets its own input's buffer, and the kept arrays' new values get fresh ones."""
    def apart(donated, kept_arrays, *rest):
        state, grads, outs = fn(split.together(donated, kept_arrays), *rest)
        return (*split.apart(state), grads, outs)
    return apart


def compiler_options(mesh) -> dict:
    """XLA options for a step compiled for `mesh`'s devices.

    On a GPU, XLA's Triton matmul fusions are turned off: autotuning them took almost all
    of a first step, for steps no faster than with cuBLAS alone (docs/benchmarks.md).

    Everywhere, XLA's excess precision is off: with it, XLA drops a rounding to bfloat16 or
    float16 followed by a widening back (a half-precision op's output fed to one computing
    in float32, as a LayerNorm after a linear layer under autocast), so the consumer sees
    the unrounded value and a third of its outputs differ from eager PyTorch's in the last
    bit; and a precision policy's rounding of products would not happen. A user who names
    either option in XLA_FLAGS keeps their own."""
    platform = mesh.devices.flat[0].platform
    flags = os.environ.get("XLA_FLAGS", "")
    options = {}
    if "xla_allow_excess_precision" not in flags:
        options["xla_allow_excess_precision"] = False
    if platform in ("gpu", "cuda", "rocm") and "xla_gpu_enable_triton_gemm" not in flags:
        options["xla_gpu_enable_triton_gemm"] = False
    return options


def write_artifacts(traced, lowered, executable, artifact_dir: str, name: str):
    """jaxpr, StableHLO, optimised HLO and cost/memory analysis of one compiled step."""
    start = time.perf_counter()
    try:
        _write(traced, lowered, executable, artifact_dir, name)
    finally:
        stats.artifact_seconds += time.perf_counter() - start


def _write(traced, lowered, executable, artifact_dir: str, name: str):
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
