"""`cstorch.backends.csx.performance.micro_batch_size`: which size a step runs with, and
the step as a loop over micro-batches.

A micro-batched step is captured for one micro-batch (shapes are baked into the graph),
with its gradients marked where `backward()` returns (`bridge.split`); the graph is cut
there, and the lowered step runs the first part once per micro-batch in one on-device
loop (`wafer.micro_batch`) and the rest (clipping, optimizer, scheduler) once, on the
combined gradients. `docs/micro-batching.md` describes the semantics.

The flag acts on the CSX backend only, as the reference says; elsewhere a value other
than None or "auto" is ignored with a warning.
"""
import dataclasses
import logging
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import jax
import numpy as np

import bridge
import wafer
from bridge.device_tensor import GradSource
from bridge.errors import MicroBatchError
from bridge.split import mark_gradients, split_at_gradients
from cstorch.backends import csx
from cstorch.notices import inform
from cstorch.optim.optimizer import hyperparameters
from cstorch.run.capture_context import UnregisteredModule

log = logging.getLogger("cstorch")
_FLAG = "cstorch.backends.csx.performance.micro_batch_size"
_TIMED_RUNS = 5


def _hashable(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _for_step(name: str):
    """The flag as set for the step called `name` (a dict keyed by step names gives each
    step its own value; steps it does not name get "auto", the default)."""
    value = csx.performance.micro_batch_size
    if isinstance(value, dict) and "explore" not in value:
        value = value.get(name, "auto")
    return value


def key(backend, name: str):
    """What a step's program depends on through the flag (part of the program cache key)."""
    if not backend.is_csx:
        return None
    value = _for_step(name)
    if value == "auto":
        return ("auto", csx.debug.act_memory_gi)
    return _hashable(value)


def setting(name: str):
    """The flag's value for the step called `name`: None, an int, "auto", or
    ("explore", min, max). A dict keyed by step names gives each step its own value;
    steps it does not name get "auto", the flag's default."""
    value = _for_step(name)
    if value == "explore":
        return ("explore", None, None)
    if isinstance(value, dict):
        bounds = value["explore"]
        return ("explore", bounds.get("min"), bounds.get("max"))
    return value


@dataclass(frozen=True)
class Plan:
    """How a call's batch is cut: `num` micro-batches of `size`; the call's tensors at
    positions `split` are cut along dimension 0, the others given whole to each."""
    size: int
    num: int
    split: tuple
    batch: int


def batch_size(call) -> int | None:
    """The batch size of a call: the leading dimension of its first tensor that has one."""
    return next((int(t.shape[0]) for t in call.tensors if t.dim() >= 1), None)


def plan(call, size: int, name: str) -> Plan | None:
    """The plan for micro-batches of `size`, or None when the batch runs whole."""
    batch = batch_size(call)
    if batch is None:
        return None
    if batch % size:
        raise ValueError(
            f"{_FLAG} is {size}, which does not divide the batch size {batch} of {name}'s "
            f"inputs (the leading dimension of its first tensor argument); micro-batches "
            f"are equal slices of the batch: use a divisor of {batch} "
            f"({', '.join(map(str, wafer.micro_batch.divisors(batch)))}), or None to run the "
            f"batch whole")
    if size == batch:
        return None
    split = tuple(j for j, t in enumerate(call.tensors) if t.dim() >= 1 and t.shape[0] == batch)
    return Plan(size, batch // size, split, batch)


class MicroBatching:
    """What `_capture` does differently for one micro-batched capture."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.split = None

    def capture_shapes(self, specs, first_input: int):
        """The capture's input specs, the cut inputs shrunk to one micro-batch."""
        specs = list(specs)
        for j in self.plan.split:
            spec = specs[first_input + j]
            specs[first_input + j] = dataclasses.replace(
                spec, shape=(self.plan.size,) + tuple(spec.shape[1:]))
        return specs

    def mark(self, params):
        return mark_gradients(params)

    def lower(self, graph, n_state: int, first_input: int, mesh):
        """The step's JAX function ``run(*flat_inputs, key=None) -> outputs``, taking the
        whole batch and looping over its micro-batches inside."""
        positions = [first_input + j for j in self.plan.split]
        try:
            split = split_at_gradients(graph, positions, {j: j for j in range(n_state)},
                                       self.plan.size)
        except MicroBatchError as e:
            raise MicroBatchError(f"{e}\n(micro_batch_size {self.plan.size}, batch "
                                  f"{self.plan.batch})") from None
        self.split = split
        per_micro_batch = bridge.lower(split.per_micro_batch)
        once = bridge.lower(split.once)
        shapes = [jax.ShapeDtypeStruct(c.shape, bridge.to_jax_dtype(c.dtype))
                  for c in split.crossings]
        modes, carried, num = split.modes, split.carried, self.plan.num

        def run(*flat, key=None):
            flat = list(flat)

            def body(index, carry, micro_batch):
                args = list(flat)
                for p, value in zip(carried, carry):
                    args[p] = value
                for p, value in zip(positions, micro_batch):
                    args[p] = value
                # Each micro-batch draws its own random numbers (dropout masks).
                return per_micro_batch(
                    *args, key=lambda: jax.random.fold_in(_make_key(key), index))

            combined = wafer.micro_batch.run_micro_batches(
                body, [flat[p] for p in positions], [flat[p] for p in carried], modes, shapes,
                num, mesh=mesh)
            return once(*flat, *combined, key=key)
        return run

    def output_shapes(self, shapes, first_output: int):
        """The returned tensors' shapes for the whole batch (per-sample values joined)."""
        shapes = list(shapes)
        for pos in self.split.concatenated:
            j = pos - first_output
            if 0 <= j < len(shapes):
                shapes[j] = (shapes[j][0] * self.plan.num,) + tuple(shapes[j][1:])
        return shapes


def _make_key(key):
    if key is None:
        return jax.random.key(0)
    return key() if callable(key) else key


# Choosing the size ------------------------------------------------------------------


def applies(backend, name: str) -> bool:
    """Whether the step called `name` is captured micro-batched (or its size chosen):
    on a CSX backend, unless the flag is None. Set on another backend, the flag warns."""
    value = setting(name)
    if not backend.is_csx:
        if value not in (None, "auto"):
            warnings.warn(
                f"{_FLAG} = {csx.performance.micro_batch_size!r} is ignored on the "
                f"{backend.backend_type} backend: micro-batching applies to CSX runs only, so "
                f"{name} runs each batch whole", stacklevel=5)
        return False
    return value is not None


def capture(backend, call, name: str, capture_one: Callable):
    """The program for this call under the flag, where it `applies`; `capture_one(micro)`
    captures and compiles the step with a `MicroBatching` (or None for the whole batch)."""
    value = setting(name)
    if isinstance(value, int):
        return _with_size(backend, call, name, capture_one, value)
    if value == "auto":
        return _auto(backend, call, name, capture_one)
    return _explore(backend, call, name, capture_one, value[1], value[2])


def _with_size(backend, call, name, capture_one, size):
    p = plan(call, size, name)
    program = capture_one(MicroBatching(p) if p is not None else None)
    program.micro_batch_size = p.size if p is not None else None
    return program


def budget(backend):
    """(bytes, what is measured against them, where the number comes from) of the
    memory a step may use per device."""
    act = csx.debug.act_memory_gi
    if act is not None:
        return int(act * 2 ** 30), "temp", "cstorch.backends.csx.debug.act_memory_gi"
    device = backend.devices[0]
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # not every platform reports memory
        limit = None
    if limit:
        return int(limit), "peak", f"the memory of {device.device_kind}"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local = max(1, sum(d.process_index == device.process_index for d in backend.devices))
    return host // local, "peak", f"the host's memory shared by {local} device(s)"


def _used(program, what):
    executable = program.compiled.executable
    if executable is None:
        return None
    return (wafer.micro_batch.temp_bytes if what == "temp" else wafer.micro_batch.peak_bytes)(
        executable)


def _auto(backend, call, name, capture_one):
    """The largest size whose program fits the memory budget: the whole batch when it
    fits (no extra compilation), else a binary search over the batch's divisors."""
    batch = batch_size(call)
    whole = capture_one(None)
    whole.micro_batch_size = None
    limit, what, source = budget(backend)
    used = _used(whole, what)
    if batch is None or used is None or used <= limit:
        log.info("%s: micro_batch_size 'auto' runs %s whole (%s of %s per device)", name,
                 "the batch" if batch is None else f"the batch of {batch}",
                 _size(used), _size(limit))
        return whole
    sizes = wafer.micro_batch.divisors(batch)[:-1]
    tried, programs = {batch: used}, {}
    best, lo, hi = None, 0, len(sizes) - 1
    try:
        while lo <= hi:   # the largest size that fits; memory grows with the size
            mid = (lo + hi) // 2
            programs[sizes[mid]] = program = _with_size(backend, call, name, capture_one,
                                                        sizes[mid])
            tried[sizes[mid]] = u = _used(program, what)
            if u is None or u <= limit:
                best, lo = program, mid + 1
            else:
                hi = mid - 1
        if best is None and sizes:
            best = programs.get(sizes[0]) or _with_size(backend, call, name, capture_one, sizes[0])
            tried[sizes[0]] = _used(best, what)
            best_fits = False
        else:
            best_fits = True
    except UnregisteredModule:
        raise
    except Exception as e:   # a step that cannot be micro-batched still runs, whole
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        inform(f"micro_batch_size 'auto' for {name}: the whole batch of {batch} needs "
               f"{_size(used)} of {_size(limit)} per device ({source}), but the step cannot be "
               f"micro-batched ({first}); it runs whole")
        _write_artifacts(backend, whole, name)
        return whole
    if best is None:   # a batch of one: nothing smaller to try
        return whole
    measured = ", ".join(f"{size}: {_size(u)}" for size, u in sorted(tried.items(), reverse=True))
    if not best_fits:
        inform(f"micro_batch_size 'auto' for {name}: no micro-batch size fits "
               f"{_size(limit)} per device ({source}); using {sizes[0]}, the smallest "
               f"(measured per size: {measured})")
    else:
        inform(f"micro_batch_size 'auto' chose {best.micro_batch_size} for {name} "
               f"(batch {batch}, {batch // best.micro_batch_size} micro-batches), the largest "
               f"size that fits {_size(limit)} per device ({source}); measured per size: "
               f"{measured}")
        _write_artifacts(backend, best, name)
    return best


def _write_artifacts(backend, program, name):
    """The chosen program's artifacts, written after the candidates' (queued in the order
    they were compiled) and so over them."""
    compiled = program.compiled
    if backend.artifacts_dir and compiled.executable is not None:
        wafer.artifact_writer.defer(
            lambda: wafer.write_artifacts(compiled.traced, compiled.lowered,
                                          compiled.executable, backend.artifacts_dir, name),
            f"the jaxpr, StableHLO and HLO of {name} in {backend.artifacts_dir}")


def _size(n):
    if n is None:
        return "unknown"
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


@dataclass
class ExploreRow:
    micro_batch_size: int
    micro_batches: int
    compile_s: float
    step_s: float | None
    peak_bytes: int | None
    fits: bool
    note: str = ""


@dataclass
class ExploreResult:
    """What `"explore"` measured for one step; `best` is the size it recommends."""
    name: str
    batch: int
    rows: list
    best: int

    def table(self) -> str:
        header = (f"{'micro_batch_size':>16} {'micro-batches':>13} {'compile s':>9} "
                  f"{'step ms':>9} {'peak MiB/device':>15}")
        lines = [header]
        for r in self.rows:
            step = "-" if r.step_s is None else f"{r.step_s * 1e3:.2f}"
            peak = "-" if r.peak_bytes is None else f"{r.peak_bytes / 2 ** 20:.2f}"
            mark = "  <- best" if r.micro_batch_size == self.best else (
                f"  {r.note}" if r.note else "" if r.fits else "  over budget")
            lines.append(f"{r.micro_batch_size:>16} {r.micro_batches:>13} {r.compile_s:>9.2f} "
                         f"{step:>9} {peak:>15}{mark}")
        return "\n".join(lines)


def _explore(backend, call, name, capture_one, lo, hi):
    """Compile and time every candidate size on copies of the state, print the table,
    and return a program that runs the best size without training."""
    batch = batch_size(call)
    if batch is None:
        raise ValueError(f"{_FLAG} 'explore' needs a batch to cut, but {name} takes no tensor "
                         "with a leading dimension")
    lo, hi = lo or 1, hi or batch
    sizes = [d for d in wafer.micro_batch.divisors(batch) if lo <= d <= hi]
    if not sizes:
        raise ValueError(
            f"{_FLAG} explores sizes from {lo} to {hi}, but no divisor of the batch size "
            f"{batch} of {name} lies there (divisors: "
            f"{', '.join(map(str, wafer.micro_batch.divisors(batch)))}); widen the bounds")
    limit, what, _ = budget(backend)
    rows, programs = [], {}
    failure = None
    for size in sizes:
        start = time.perf_counter()
        try:
            program = _with_size(backend, call, name, capture_one, size)
        except UnregisteredModule:
            raise   # registered by the caller, then explored again
        except Exception as e:   # a size the model cannot take (BatchNorm on one sample)
            failure = e
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            rows.append(ExploreRow(size, batch // size, time.perf_counter() - start, None,
                                   None, False, f"failed: {first[:80]}"))
            continue
        compile_s = time.perf_counter() - start
        used = _used(program, what)
        rows.append(ExploreRow(size, batch // size, compile_s, _time(program, backend, call),
                               _used(program, "peak"), used is None or used <= limit))
        programs[size] = program
    if not programs:
        raise failure
    fitting = [r for r in rows if r.fits] or [r for r in rows if r.micro_batch_size in programs]
    timed = [r for r in fitting if r.step_s is not None]
    best = (min(timed, key=lambda r: (r.step_s, -r.micro_batch_size)) if timed
            else max(fitting, key=lambda r: r.micro_batch_size)).micro_batch_size
    result = ExploreResult(name, batch, rows, best)
    _write_artifacts(backend, programs[best], name)
    print(f"cstorch: micro_batch_size explore for {name} (batch {batch}, "
          f"{len(backend.devices)} device(s)); nothing is trained:\n{result.table()}\n"
          f"best: {best}; set {_FLAG} = {best} to train with it", flush=True)
    return _not_training(programs[best], result)


def _hyper_vector(backend):
    values = [v for *_, v in hyperparameters(backend.optimizers) if v != 0]
    return np.asarray(values + [1 - v for v in values], np.float32)


def _copy(arrays):
    out = [jax.device_put(a, a.sharding, may_alias=False) if isinstance(a, jax.Array) else a
           for a in arrays]
    jax.block_until_ready(out)
    return out


def _time(program, backend, call):
    """The median wall time of the program's step on copies of the state; None when
    the backend does not execute."""
    if program.compiled.executable is None or not getattr(backend, "executes", True):
        return None
    state = [c.array for c in backend.state.cells]
    grads = _copy([backend.state.cells[i].array for i in program.grad_inputs])
    hyper = _hyper_vector(backend)
    inputs = [bridge.tensor_to_input(t) for t in call.tensors]
    rng = np.zeros(2, np.uint32)
    times = []
    for run in range(_TIMED_RUNS + 1):   # the first run warms up
        copies = _copy(state)
        start = time.perf_counter()
        jax.block_until_ready(program.compiled(copies, grads, hyper, inputs, rng))
        if run:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class _NotTraining:
    """A compiled step run on copies of the state: the live state and the gradients come
    back as they went in, so nothing trains."""

    def __init__(self, compiled):
        self.inner = compiled
        self.executable = compiled.executable
        self.input_shardings = compiled.input_shardings

    def jaxpr(self):
        return self.inner.jaxpr()

    def __call__(self, state, grads, hyper, inputs, rng):
        _, _, outs = self.inner(_copy(state), grads, hyper, inputs, rng)
        return list(state), list(grads), outs


def _not_training(program, result: ExploreResult) -> Any:
    return dataclasses.replace(
        program, compiled=_NotTraining(program.compiled), grad_outputs=list(program.grad_inputs),
        grad_layout=None, grad_source=GradSource(), grads_bound=-1, explored=result)
