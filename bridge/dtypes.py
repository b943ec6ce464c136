"""The one mapping between torch dtypes and the dtypes JAX computes in.

JAX runs with 64-bit types off by default, so int64 and float64 tensors live on the
device as int32 and float32; values cross back to torch in the tensor's own dtype.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

_TORCH_TO_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}
_NUMPY_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_NUMPY.items()}


def to_jax_dtype(dtype: torch.dtype):
    """The dtype a JAX array holding a tensor of `dtype` has (canonicalised for x64 mode)."""
    try:
        return jax.dtypes.canonicalize_dtype(_TORCH_TO_NUMPY[dtype])
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no JAX equivalent") from None


def to_torch_dtype(dtype) -> torch.dtype:
    return _NUMPY_TO_TORCH[np.dtype(dtype)]


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """`t` as a numpy array in the dtype JAX computes `t`'s dtype in (no JAX op runs, so
    nothing is compiled for the conversion)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    host = t.numpy()
    want = to_jax_dtype(t.dtype)
    return host if host.dtype == want else host.astype(want)


def tensor_to_jax(t: torch.Tensor) -> jax.Array:
    """A host copy of `t` as a JAX array in the dtype JAX computes `t`'s dtype in."""
    return jnp.asarray(tensor_to_numpy(t))


def jax_to_tensor(a, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch CPU tensor with the value of the JAX array (or numpy array) `a`.

    `dtype` is the torch dtype the value belongs to (int64 for a label array computed as
    int32, say); without it the array's own dtype is used.
    """
    host = np.asarray(a)
    if host.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(host.copy() if not host.flags.writeable else host)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t
