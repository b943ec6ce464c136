"""ATen lowerings, one family per module, all in one registry keyed by op overload."""
from bridge.ops.registry import LOWERINGS, lowering
from bridge.ops import (attention, bessel, binning, checks, conv, creation,  # noqa: F401
                        elementwise, factorization, fft, indexing, linalg, loss, norm, ordering,
                        pooling, random, recurrent, reduction, resample, shape, sharding,
                        special)
# Last: its lowerings apply the per-tensor ones registered above.
from bridge.ops import foreach  # noqa: F401,E402

__all__ = ["LOWERINGS", "lowering"]
