"""`cerebras.pytorch.numpy`: tensors to and from NumPy arrays (`from_numpy`, `to_numpy`,
also at the top level as `cstorch.from_numpy` / `cstorch.to_numpy`)."""
from cstorch.utils.numpy import from_numpy, to_numpy

__all__ = ["from_numpy", "to_numpy"]
