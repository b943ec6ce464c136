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
    artifact_seconds: float = 0.0   # writing jaxpr, StableHLO, HLO and analyses

    @property
    def compiled(self) -> int:
        return self.requested - self.cache_hits


stats = CompileStats()
_hits_now = [0]


def _on_event(event: str, **kwargs):
    if event == _HIT_EVENT:
        _hits_now[0] += 1


monitoring.register_event_listener(_on_event)


def use_compile_dir(path: str) -> None:
    """Read and write compiled programs in `path` from now on (created if missing)."""
    os.makedirs(path, exist_ok=True)
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
