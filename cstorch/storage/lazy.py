"""Tensors whose data is produced on use: read from a checkpoint file, or a fill value.

`LazyTensor` is a wrapper subclass of `torch.Tensor` with the right shape and dtype but
no storage. Every torch function or method that needs the data first materialises it
(through `__torch_function__`, with `__torch_dispatch__` as the backstop for calls that
reach the dispatcher directly), so a lazy tensor can be used anywhere a tensor can.
Metadata queries (shape, dtype, device, ...) never touch the data.
"""
import os
import threading

import torch
import torch.utils._pytree as pytree

from cstorch.storage.dtypes import read_dataset

_META_PROPS = ("shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_leaf",
               "grad", "grad_fn", "is_cuda", "is_sparse", "is_quantized", "is_meta",
               "is_nested", "names", "_version", "output_nr", "is_mps", "is_xpu")
_META_METHODS = ("size", "dim", "numel", "nelement", "element_size", "is_floating_point",
                 "is_complex", "get_device", "__hash__", "ndimension", "is_signed",
                 "__len__", "__torch_function__")


def _meta_funcs():
    out = set()
    for name in _META_PROPS:
        prop = getattr(torch.Tensor, name, None)
        if prop is not None and hasattr(prop, "__get__"):
            out.add(prop.__get__)
    for name in _META_METHODS:
        fn = getattr(torch.Tensor, name, None)
        if fn is not None:
            out.add(fn)
    return out


_META = _meta_funcs()
_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                    "__irshift__", "__imatmul__", "__setitem__", "__set__"}


def _mutates(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    if name in _INPLACE_DUNDERS or kwargs.get("out") is not None:
        return True
    return name.endswith("_") and not name.endswith("__")


class LazyTensor(torch.Tensor):
    """Base of tensors that hold no data until used; subclasses define `_produce`.

    `keep` says whether the produced value is kept after the first use; a value that
    is modified in place is always kept, so the change is not lost.
    """

    @staticmethod
    def __new__(cls, shape, dtype, keep=False):
        return torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device="cpu", requires_grad=False)

    _handles_ops = False  # True where a subclass records ops instead of building its data

    def __init__(self, shape, dtype, keep=False):
        self._keep = keep
        self._value = None
        self._lock = threading.Lock()

    def _produce(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _alias(self) -> "LazyTensor":
        """A detached tensor of the same class and data, not yet produced."""
        return self.materialize().detach()

    def materialize(self, keep: bool = False) -> torch.Tensor:
        """The data as an ordinary tensor (kept for later uses if `keep` or the tensor caches)."""
        value = self._value
        if value is not None:
            return value
        with self._lock:
            if self._value is not None:
                return self._value
            value = self._produce()
            if tuple(value.shape) != tuple(self.shape) or value.dtype != self.dtype:
                raise RuntimeError(
                    f"lazy tensor produced {tuple(value.shape)} {value.dtype}, "
                    f"expected {tuple(self.shape)} {self.dtype}")
            if keep or self._keep:
                self._value = value
            return value

    @property
    def is_materialized(self) -> bool:
        return self._value is not None

    def device_value(self, sharding):
        """The value built directly on the devices, laid out by `sharding`, or None when
        it can only be made on the host (then `cstorch.compile` uploads it)."""
        return None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _META:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func is torch.Tensor.detach and not args[0].is_materialized:
            # Still lazy: `nn.Parameter(cstorch.zeros(...))` detaches and needs its own type.
            return args[0]._alias()
        if func is torch.Tensor.requires_grad_:  # autograd metadata: no data needed
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        keep = _mutates(func, kwargs)
        args, kwargs = pytree.tree_map_only(
            LazyTensor, lambda t: t._materialized_for(keep), (args, kwargs))
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default and not args[0].is_materialized:
            return args[0]._alias()
        keep = func._schema.is_mutable if hasattr(func, "_schema") else False
        args, kwargs = pytree.tree_map_only(
            LazyTensor, lambda t: t._materialized_for(keep), (args, kwargs))
        return func(*args, **kwargs)

    def _materialized_for(self, keep):
        """What an op that also takes another lazy tensor gets for this one: its data, or
        itself where its class handles ops on its own (a write into a built copy would be
        lost)."""
        return self if self._handles_ops else self.materialize(keep=keep)

    def __repr__(self, *, tensor_contents=None):
        return repr(self.materialize())


class FileSource:
    """An open checkpoint file shared by the lazy tensors loaded from it.

    Holding the handle keeps the data readable even when the path is later replaced
    or deleted (the next `save` to the same path, or `max_checkpoints` pruning).
    """

    def __init__(self, h5file, name):
        self._file = h5file
        self.name = name
        filename = getattr(h5file, "filename", None)
        self.path = filename if isinstance(filename, str) and os.path.isfile(filename) else None
        self._lock = threading.Lock()

    def read(self, key, dtype):
        with self._lock:
            try:
                if self._file is None:
                    raise ValueError("the file was closed")
                return read_dataset(self._file[key], dtype)
            except Exception as e:
                raise RuntimeError(f"cannot read tensor {key!r} from checkpoint {self.name}: {e}") from e

    def attribute(self, key, name, default=None):
        with self._lock:
            try:
                return self._file[key].attrs.get(name, default)
            except Exception:
                return default

    def close(self):
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except Exception:
                    pass
                self._file = None

    def __del__(self):
        self.close()


class FileTensor(LazyTensor):
    """A tensor stored in a checkpoint file, read on use (and kept when `keep`)."""

    @staticmethod
    def __new__(cls, source, key, shape, dtype, keep=False):
        return LazyTensor.__new__(cls, shape, dtype)

    def __init__(self, source, key, shape, dtype, keep=False):
        super().__init__(shape, dtype, keep)
        self._source = source
        self._key = key

    def _produce(self):
        return self._source.read(self._key, self.dtype)

    @property
    def key(self) -> str:
        """The dataset this tensor is read from."""
        return self._key

    @property
    def source_path(self):
        """The path of the file this tensor is read from (None if it was not a file)."""
        return self._source.path

    def source_attribute(self, name, default=None):
        """An HDF5 attribute of this tensor's dataset in its file (`default` if absent or
        the file is closed)."""
        return self._source.attribute(self._key, name, default)
