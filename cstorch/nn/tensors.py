"""`cerebras.pytorch.nn.Parameter` and `Buffer`: PyTorch's markers for module state."""
import torch

__all__ = ["Buffer", "Parameter"]


class _WrapperTensorMixin:
    """What `Parameter` and `Buffer` add to PyTorch's: nothing here, where a module's
    state is held as ordinary tensors until a backend moves it to the device."""


class Parameter(_WrapperTensorMixin, torch.nn.Parameter):
    """`torch.nn.Parameter(data=None, requires_grad=True)`: a tensor that, set as a
    module attribute, is registered as a parameter of the module."""


class _BufferMeta(type(torch.nn.Buffer)):
    def __instancecheck__(cls, instance) -> bool:
        # The tensors made are PyTorch's buffer markers; they are this class's instances.
        return isinstance(instance, torch.nn.Buffer) or super().__instancecheck__(instance)


class Buffer(_WrapperTensorMixin, torch.Tensor, metaclass=_BufferMeta):
    """`torch.nn.Buffer(data=None, *, persistent=True)`: a tensor that, set as a module
    attribute, is registered as a buffer of the module (in its `state_dict()` when
    `persistent`). As with PyTorch's, the value made is a plain tensor marked as a
    buffer, which `isinstance(x, Buffer)` recognises."""

    def __new__(cls, data=None, *, persistent=True):
        return torch.nn.Buffer(data, persistent=persistent)
