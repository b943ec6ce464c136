"""ATen lowerings, one family per module, all in one registry keyed by op overload."""
from bridge.ops.registry import LOWERINGS, lowering
from bridge.ops import (conv, creation, elementwise, indexing, linalg, norm, pooling,  # noqa: F401
                        random, reduction, shape)
from bridge.ops import attention, factorization, misc, resample, special  # noqa: F401

__all__ = ["LOWERINGS", "lowering"]
