"""`cstorch.from_numpy` and `cstorch.to_numpy`."""
import numpy as np
import torch

from bridge import jax_to_tensor


def from_numpy(array) -> torch.Tensor:
    """A torch tensor with the values of a numpy array (bfloat16 included)."""
    return jax_to_tensor(np.asarray(array))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array with the values of a torch tensor (bfloat16 as ml_dtypes.bfloat16)."""
    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
