"""Micro-batching on the device: one loop over the micro-batches of a batch.

A batch of `num * m` samples runs as `num` micro-batches of `m` in one `lax.scan` (an XLA
while loop, not unrolled), so the program's activations are those of one micro-batch.
What each micro-batch hands on combines by mode:

- "mean": averaged over the micro-batches (summed in at least float32). A gradient of a
  mean-reduced loss averaged over equal micro-batches is the whole batch's gradient.
- "carry": state threaded through the loop (micro-batch i+1 starts from what i left);
  the final value.
- "concat": per-sample values, joined back into the whole batch in order.
- "last": the last micro-batch's value (integers, and values all micro-batches share).

Micro-batch i holds samples ``i*m .. (i+1)*m - 1``. On a mesh, each micro-batch is laid
over the batch axes as a whole batch would be, so every micro-batch uses the whole wafer.
"""
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from wafer.layout import batch_sharding, state_sharding

MODES = ("mean", "carry", "concat", "last")


def divisors(n: int) -> list[int]:
    """The micro-batch sizes a batch of `n` can be cut into, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _micro_sharding(mesh, shape):
    """(num, m, ...) with the micro-batch dimension laid out as a batch of m would be."""
    spec = batch_sharding(mesh, shape[1:]).spec
    return NamedSharding(mesh, PartitionSpec(None, *spec))


def _accumulator_dtype(dtype):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return jnp.float32
    return dtype


def run_micro_batches(body: Callable, batch: Sequence, carry: Sequence, modes: Sequence[str],
                      shapes: Sequence, num: int, *, mesh=None) -> list:
    """Run ``body(index, carry, micro_batch) -> outs`` once per micro-batch, on the device.

    `batch`: arrays of `num * m` samples along dimension 0, cut into `num` micro-batches
    of `m`; `body` gets micro-batch `index` of each. `carry`: the initial values of the
    carried state; `body` gets the current ones, and its outputs in mode "carry" are the
    next ones, in order. `modes` gives each output's mode (see the module docstring),
    `shapes` its shape and dtype for one micro-batch (`jax.ShapeDtypeStruct` or alike).
    Returns the combined outputs in `modes` order.
    """
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown micro-batch combination mode(s) {unknown}; expected {MODES}")
    if sum(m == "carry" for m in modes) != len(carry):
        raise ValueError(f"{len(carry)} carried values but {sum(m == 'carry' for m in modes)} "
                         "outputs in mode 'carry'; there must be one per carried value")
    for x in batch:
        if x.shape[0] % num:
            raise ValueError(f"a batch of {x.shape[0]} samples does not split into {num} "
                             "micro-batches of equal size")
    spread = mesh is not None and mesh.size > 1
    micro = []
    for x in batch:
        x = jnp.reshape(x, (num, x.shape[0] // num) + tuple(x.shape[1:]))
        if spread:
            x = jax.lax.with_sharding_constraint(x, _micro_sharding(mesh, x.shape))
        micro.append(x)

    def constrain(x):
        return jax.lax.with_sharding_constraint(x, state_sharding(mesh, x.shape)) if spread else x

    sums = [constrain(jnp.zeros(s.shape, _accumulator_dtype(s.dtype)))
            for s, m in zip(shapes, modes) if m == "mean"]
    lasts = [jnp.zeros(s.shape, s.dtype) for s, m in zip(shapes, modes) if m == "last"]

    def step(state, xs):
        carried, sums, lasts = state
        index, micro_batch = xs
        outs = body(index, list(carried), list(micro_batch))
        if len(outs) != len(modes):
            raise ValueError(f"the micro-batch body returned {len(outs)} values for "
                             f"{len(modes)} modes")
        new = {"carry": [], "mean": [], "last": [], "concat": []}
        it = {"carry": iter(carried), "mean": iter(sums), "last": iter(lasts)}
        for out, mode in zip(outs, modes):
            if mode == "concat":
                new["concat"].append(out)
                continue
            before = next(it[mode])
            if mode == "mean":
                out = constrain(before + out.astype(before.dtype))
            new[mode].append(jax.lax.convert_element_type(out, before.dtype))
        return (new["carry"], new["mean"], new["last"]), new["concat"]

    (carried, sums, lasts), stacked = jax.lax.scan(
        step, (list(carry), sums, lasts), (jnp.arange(num, dtype=jnp.int32), micro))
    it = {"carry": iter(carried), "mean": iter(sums), "last": iter(lasts), "concat": iter(stacked)}
    result = []
    for mode, s in zip(modes, shapes):
        value = next(it[mode])
        if mode == "mean":
            value = (value / num).astype(s.dtype)
        elif mode == "concat":
            value = jnp.reshape(value, (num * value.shape[1],) + tuple(value.shape[2:]))
        result.append(value)
    return result


def peak_bytes(executable) -> int | None:
    """Peak device memory of a compiled program, per device, from XLA's memory analysis
    (None where the platform reports none)."""
    try:
        stats = executable.memory_analysis()
    except Exception:  # not every platform analyses memory
        return None
    if stats is None:
        return None
    # Some platforms (the CPU) report a peak that leaves out the scratch buffers: take
    # the larger of it and everything the program holds at once at most.
    held = (stats.argument_size_in_bytes + stats.output_size_in_bytes
            - stats.alias_size_in_bytes + stats.temp_size_in_bytes)
    return int(max(getattr(stats, "peak_memory_in_bytes", 0) or 0, held))


def temp_bytes(executable) -> int | None:
    """XLA's scratch memory of a compiled program per device: activations and workspace,
    what the micro-batch size governs."""
    try:
        stats = executable.memory_analysis()
    except Exception:
        return None
    return None if stats is None else int(stats.temp_size_in_bytes)
