"""A compiled step as bytes, and back: the executable XLA made, kept in a `compile_dir` so
that a new process runs the step without tracing, lowering or compiling it again.

The bytes hold the executable for the devices it was compiled for; the caller keys them by
everything they depend on (devices, versions, the program's source) and reads them back
only on the same devices.
"""
import pickle
import time

from jax.experimental import serialize_executable

from wafer.cache import cache_off, stats
from wafer.compile import CompiledStep, StateSplit
from wafer.layout import batch_sharding

FORMAT = 1


def dumps(step: CompiledStep) -> bytes:
    """`step`'s executable and how its state list is split (its kept arrays)."""
    if step.executable is None:
        raise ValueError("a step that was lowered but not compiled has no executable to store")
    executable = step.executable
    if step.from_cache:
        # An executable read from JAX's persistent cache serializes without its compiled
        # kernels on the CPU (another process then fails to find them): compiled afresh.
        # An option (at its default) makes JAX compile again instead of returning the
        # executable it keeps for the lowering.
        with cache_off():
            executable = step.lowered.compile(compiler_options={
                "xla_embed_ir_in_executable": False, **(step.compiler_options or {})})
    payload, in_tree, out_tree = serialize_executable.serialize(executable)
    return pickle.dumps((FORMAT, payload, in_tree, out_tree, step.kept,
                         len(step.split.donated) + len(step.split.kept) if step.split else 0,
                         [tuple(s) for s in step.input_shapes]))


def loads(data: bytes, mesh) -> CompiledStep:
    """The step `dumps` stored, loaded onto `mesh`'s devices. Raises ValueError for bytes
    that are not such a step."""
    start = time.perf_counter()
    try:
        fmt, payload, in_tree, out_tree, kept, n, input_shapes = pickle.loads(data)
    except Exception as e:
        raise ValueError(f"not a stored step ({type(e).__name__}: {e})") from None
    if fmt != FORMAT:
        raise ValueError(f"a stored step of format {fmt}, this version reads {FORMAT}")
    executable = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    stats.loading_seconds += time.perf_counter() - start
    return CompiledStep(executable, None, None,
                        [batch_sharding(mesh, s) for s in input_shapes],
                        StateSplit(n, kept) if kept else None, input_shapes)
