"""`cstorch.from_numpy` and `cstorch.to_numpy`."""
import numpy as np
import torch

from bridge import numpy_to_tensor, tensor_to_numpy


def from_numpy(array) -> torch.Tensor:
    """A torch tensor with the values of a numpy array (bfloat16 included)."""
    return numpy_to_tensor(np.asarray(array))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array with the values of a torch tensor (bfloat16 as ml_dtypes.bfloat16)."""
    return tensor_to_numpy(tensor)
