"""ATen lowerings, one family per module, all in one registry keyed by op overload."""
from bridge.ops.registry import LOWERINGS, lowering
from bridge.ops import (conv, creation, elementwise, indexing, linalg, norm, pooling,  # noqa: F401
                        random, reduction, shape)
from bridge.ops import (attention, bessel, binning, factorization, loss, misc,  # noqa: F401
                        resample, special)

__all__ = ["LOWERINGS", "lowering"]
