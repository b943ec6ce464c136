"""`cstorch.full`, `zeros`, `ones` and their `_like` forms: tensors known by shape, dtype
and one fill value, which take no memory until their data is needed."""
import jax.numpy as jnp
import torch

from bridge import to_jax_dtype
from cstorch.storage.lazy import LazyTensor


def _shape(shape):
    if isinstance(shape, int):
        return (shape,)
    if isinstance(shape, torch.Size):
        return tuple(shape)
    shape = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    return shape


class DeferredFullTensor(LazyTensor):
    """A tensor of one repeated value. Its data is built on first use and kept from then
    on; `cstorch.save` writes it as an ordinary tensor without building it."""

    @staticmethod
    def __new__(cls, shape, dtype, fill_value):
        return LazyTensor.__new__(cls, _shape(shape), dtype)

    def __init__(self, shape, dtype, fill_value):
        # Kept once built: later uses see the same data, and in-place edits stick.
        super().__init__(_shape(shape), dtype, keep=True)
        self.fill_value = fill_value

    def _produce(self):
        return torch.full(tuple(self.shape), self.fill_value, dtype=self.dtype)

    def device_value(self, sharding):
        if self.is_materialized:  # possibly edited in place: its data is the value
            return None
        return jnp.full(tuple(self.shape), self.fill_value, to_jax_dtype(self.dtype), device=sharding)

    def _alias(self):
        return DeferredFullTensor(tuple(self.shape), self.dtype, self.fill_value)


def _check_dtype(dtype):
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        # zeros(1000, 1000): the second size landed in `dtype`.
        raise TypeError(f"the shape is one tuple, as in cstorch.zeros((1000, 1000)); got a "
                        f"second positional argument {dtype!r} where the dtype goes")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")


def _scalar(value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"value must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return value.item()
    if not isinstance(value, (bool, int, float, complex)):
        raise TypeError(f"value must be a number, got {type(value).__name__}")
    return value


def full(shape, value, dtype=None):
    """A lazily initialised tensor of `shape` filled with `value`.

    With `dtype=None` the dtype follows the value as in `torch.full`: bool for a bool,
    int64 for an int, the default float dtype for a float.
    """
    _check_dtype(dtype)
    value = _scalar(value)
    if dtype is None:
        dtype = torch.tensor(value).dtype if not isinstance(value, float) else torch.get_default_dtype()
    return DeferredFullTensor(shape, dtype, value)


def full_like(other, value, dtype=None):
    """A lazily initialised tensor shaped like `other`, filled with `value`, of `other`'s
    dtype unless `dtype` is given."""
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"other must be a torch.Tensor, got {type(other).__name__}")
    _check_dtype(dtype)
    return DeferredFullTensor(tuple(other.shape), dtype or other.dtype, _scalar(value))


def zeros(shape, dtype=None):
    """A lazily initialised tensor of zeros (default float dtype unless `dtype`)."""
    _check_dtype(dtype)
    return DeferredFullTensor(shape, dtype or torch.get_default_dtype(), 0)


def zeros_like(other, dtype=None):
    """A lazily initialised tensor of zeros shaped like `other`."""
    return full_like(other, 0, dtype)


def ones(shape, dtype=None):
    """A lazily initialised tensor of ones (default float dtype unless `dtype`)."""
    _check_dtype(dtype)
    return DeferredFullTensor(shape, dtype or torch.get_default_dtype(), 1)


def ones_like(other, dtype=None):
    """A lazily initialised tensor of ones shaped like `other`."""
    return full_like(other, 1, dtype)
