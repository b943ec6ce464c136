"""How torch dtypes are stored in the HDF5 file, and the conversions both ways."""
import numpy as np
import torch

from bridge.device_tensor import DeviceTensor

# rtfx_dtypes ids written by the reference package, next to the dtype names.
RTFX_IDS = {
    torch.bool: 1, torch.int16: 3, torch.int32: 4, torch.int64: 5, torch.uint8: 6,
    torch.float16: 10, torch.float32: 11, torch.float64: 12, torch.bfloat16: 15,
}
_FROM_RTFX = {v: k for k, v in RTFX_IDS.items()}

_NATIVE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}
_RAW_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)


def dtype_from_name(name: str) -> torch.dtype:
    attr = name[len("torch."):] if name.startswith("torch.") else name
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def dtype_from_rtfx(ident: int) -> torch.dtype:
    if ident not in _FROM_RTFX:
        raise ValueError(f"unknown rtfx dtype id {ident!r}")
    return _FROM_RTFX[ident]


def tensor_to_storage_array(t: torch.Tensor) -> np.ndarray:
    """A numpy array holding the tensor's bytes in its HDF5 storage dtype (bfloat16 and
    other dtypes numpy lacks travel as integers of the same width)."""
    if isinstance(t, DeviceTensor):
        t = t.host()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype not in _NATIVE:
        raw = _RAW_BY_SIZE.get(t.element_size())
        if raw is None:
            raise TypeError(f"cannot store tensors of dtype {t.dtype}")
        t = t.view(raw)
    return t.numpy()


def storage_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype in _NATIVE:
        return torch.empty((), dtype=dtype).numpy().dtype
    raw = _RAW_BY_SIZE[torch.empty((), dtype=dtype).element_size()]
    return torch.empty((), dtype=raw).numpy().dtype


def numpy_to_tensor(arr, dtype: torch.dtype) -> torch.Tensor:
    arr = np.asarray(arr)  # not ascontiguousarray: that turns 0-d into 1-d
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        arr = arr.copy()
    t = torch.from_numpy(arr)
    if t.dtype == dtype:
        return t
    if t.element_size() == torch.empty((), dtype=dtype).element_size() and dtype not in _NATIVE:
        return t.view(dtype)
    return t.to(dtype)


def read_dataset(ds, dtype: torch.dtype) -> torch.Tensor:
    """A tensor dataset read straight into a new tensor's memory (no numpy array in
    between to allocate, copy or convert)."""
    shape = tuple(ds.shape)
    if not shape or ds.size == 0:
        return numpy_to_tensor(ds[()], dtype)
    out = torch.empty(shape, dtype=dtype)
    view = out if dtype in _NATIVE else out.view(_RAW_BY_SIZE[out.element_size()])
    target = view.numpy()
    if target.dtype != ds.dtype:  # stored in another width (an older writer): convert
        return numpy_to_tensor(ds[()], dtype)
    ds.read_direct(target)
    return out
