"""Compile a step's JAX function for a mesh, and write what the compiler made of it."""
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import jax

from wafer.layout import batch_sharding, replicated, state_sharding


@dataclass
class CompiledStep:
    """An XLA executable of ``fn(state, inputs, rng) -> (new_state, outputs)``."""
    executable: Any
    lowered: Any
    state_shardings: Any
    input_shardings: Any

    def __call__(self, state, inputs, key):
        return self.executable(state, inputs, key)


def compile_step(fn: Callable, state, inputs, key, *, mesh, artifact_dir: str | None = None,
                 name: str = "step") -> CompiledStep:
    """Jit `fn` for `mesh` (state laid over the grid, inputs split over the batch), donating
    the old state, and compile it ahead of time so later calls never retrace or recompile."""
    state_sh = jax.tree.map(lambda a: state_sharding(mesh, a.shape), state)
    input_sh = [batch_sharding(mesh, getattr(x, "shape", ())) for x in inputs]
    jitted = jax.jit(fn, in_shardings=(state_sh, input_sh, replicated(mesh)),
                     out_shardings=(state_sh, None), donate_argnums=(0,))
    lowered = jitted.lower(state, inputs, key)
    executable = lowered.compile()
    if artifact_dir:
        write_artifacts(fn, lowered, executable, (state, inputs, key), artifact_dir, name)
    return CompiledStep(executable, lowered, state_sh, input_sh)


def write_artifacts(fn, lowered, executable, args, artifact_dir: str, name: str):
    """jaxpr, StableHLO, optimised HLO and cost/memory analysis of one compiled step."""
    os.makedirs(artifact_dir, exist_ok=True)
    path = lambda ext: os.path.join(artifact_dir, f"{name}.{ext}")  # noqa: E731
    with open(path("jaxpr.txt"), "w") as f:
        f.write(str(jax.make_jaxpr(fn)(*args)))
    with open(path("stablehlo.mlir"), "w") as f:
        f.write(lowered.as_text())
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
