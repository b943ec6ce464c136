"""The persistent compilation cache (a backend's `compile_dir`), and a count of the XLA
compilations steps needed.

A second process compiling the same step for the same devices reads the executable from
`compile_dir` instead of running XLA's compiler. JAX keeps only programs that took at least
a second to compile by default; every step program is worth keeping here, so the
thresholds are lowered to zero.
"""
import contextlib
import os
import time
from dataclasses import dataclass

import jax
from jax import monitoring

_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclass
class CompileStats:
    """Step programs compiled in this process: `requested` compilations, of which
    `cache_hits` were read from the persistent cache; `compiled` ran XLA's compiler."""
    requested: int = 0
    cache_hits: int = 0
    seconds: float = 0.0   # spent in XLA compilation or reading the cache
    lowering_seconds: float = 0.0   # tracing the JAX function and lowering it to StableHLO
    # writing jaxpr, StableHLO, HLO and analyses, while the first call runs (artifact_writer)
    artifact_seconds: float = 0.0
    loading_seconds: float = 0.0    # reading executables a compile_dir stored (wafer.stored)

    @property
    def compiled(self) -> int:
        return self.requested - self.cache_hits


stats = CompileStats()
_hits_now = [0]
_directory = [None]


def _on_event(event: str, **kwargs):
    if event == _HIT_EVENT:
        _hits_now[0] += 1


monitoring.register_event_listener(_on_event)


def use_compile_dir(path: str) -> None:
    """Read and write compiled programs in `path` from now on (created if missing)."""
    os.makedirs(path, exist_ok=True)
    _directory[0] = os.path.abspath(path)
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        # JAX sets its cache up once, at the first compilation; one that ran before the
        # directory was chosen would leave it off for the rest of the process.
        from jax._src import compilation_cache  # noqa: PLC0415 (private; may move between jax releases)
        compilation_cache.reset_cache()
    except (ImportError, AttributeError):
        pass


def cache_hits() -> int:
    """How many compilations the persistent cache served in this process."""
    return _hits_now[0]


@contextlib.contextmanager
def cache_off():
    """Compile without the persistent cache inside the block."""
    # JAX decides once whether to use its cache; reset_cache makes it decide again.
    from jax._src import compilation_cache  # noqa: PLC0415 (private; may move between jax releases)
    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()


def compile_dir():
    """The directory `use_compile_dir` named last, or None."""
    return _directory[0]


@contextlib.contextmanager
def counted():
    """Count one step compilation, and whether the persistent cache served it."""
    before = _hits_now[0]
    stats.requested += 1
    start = time.perf_counter()
    try:
        yield
    finally:
        stats.seconds += time.perf_counter() - start
        stats.cache_hits += min(1, _hits_now[0] - before)
