"""One serializer per kind of leaf: what goes into `<key>.__metadata__` and the dataset,
and how a leaf is rebuilt from them. Names follow the `__TYPE__` values of the format."""
import contextlib
import contextvars
import json
import os
import pickle

import h5py
import numpy as np
import torch
from h5py import h5d, h5p

try:  # the LZ4 filter every tensor dataset is written through
    import hdf5plugin
except ImportError:  # pragma: no cover - h5py alone writes the data unfiltered
    hdf5plugin = None

from cstorch.storage import pickling
from cstorch.storage.creation import DeferredFullTensor
from cstorch.storage.dtypes import (RTFX_IDS, dtype_from_name, dtype_from_rtfx,
                                    read_dataset, storage_numpy_dtype, tensor_to_storage_array)
from cstorch.storage.lazy import FileTensor, LazyTensor
import sys
from bridge import numpy_to_tensor

# Switches `cache_deferred_tensors` and `use_external_link` set (see there).
_cache_deferred: contextvars.ContextVar = contextvars.ContextVar(
    "cstorch_cache_deferred_tensors", default=None)
_external_links: contextvars.ContextVar = contextvars.ContextVar(
    "cstorch_use_external_link", default=False)


@contextlib.contextmanager
def cache_deferred_tensors(cache: bool = True):
    """While inside, tensors `cstorch.load` returns unread (read from the file on use)
    keep (`cache=True`) or drop (`cache=False`) their values after the first read.

    By default a loaded tensor is read again on every use (`map_location=None`) or kept
    after its first read (`map_location="cache"`); this overrides both for the loads made
    inside. Comparing two large checkpoints tensor by tensor under
    ``cache_deferred_tensors(False)`` holds one tensor in memory at a time.
    """
    if not isinstance(cache, bool):
        raise TypeError(f"cache_deferred_tensors expects a bool, got {cache!r}")
    token = _cache_deferred.set(cache)
    try:
        yield
    finally:
        _cache_deferred.reset(token)


@contextlib.contextmanager
def use_external_link(enabled: bool = True):
    """While inside (with `enabled`), `cstorch.save` writes a tensor that was loaded from
    another checkpoint and not read or changed since as an HDF5 external link to its
    dataset in that file, instead of copying its data. Re-saving a loaded checkpoint with
    a few extra entries then takes no time and no space, and `cstorch.load` reads the
    links transparently. The new file depends on the old one: moving or deleting the old
    file breaks it (with `max_checkpoints`, mind the pruning).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"use_external_link expects a bool, got {enabled!r}")
    token = _external_links.set(enabled)
    try:
        yield
    finally:
        _external_links.reset(token)


def _keeps(mode: str) -> bool:
    """Whether lazily loaded tensors keep their value after the first read."""
    cache = _cache_deferred.get()
    return mode == "cache" if cache is None else cache


def external_source(leaf):
    """(file path, dataset key, compressed) of a tensor to save as an external link, or
    None: only under `use_external_link`, for a loaded tensor not yet read whose file
    still exists."""
    if not _external_links.get() or not isinstance(leaf, FileTensor) or leaf.is_materialized:
        return None
    path = leaf.source_path
    if not path or not os.path.isfile(path):
        return None
    compressed = leaf.source_attribute("compressed", False)
    return os.path.abspath(path), leaf.key, bool(compressed)


def write_external_tensor(f, key, tensor, path, source_key, compressed):
    """Write `key` as a link to dataset `source_key` of file `path` (not opened here: the
    process may hold that file open for reading)."""
    f[key] = h5py.ExternalLink(path, source_key)
    return tensor_inner(tensor, compressed)


# HDF5 keeps attributes in the object header, which holds at most 64 KiB per message;
# larger pickles go into the dataset body instead (our reader accepts both).
_MAX_ATTR_BYTES = 60_000


def leaf_spec_json(key: str) -> str:
    """treespec_dumps of {key: leaf}, written out directly (one per leaf adds up)."""
    leaf = {"type": None, "context": None, "children_spec": []}
    return json.dumps([1, {"type": "builtins.dict", "context": json.dumps([key]),
                           "children_spec": [leaf]}])


def leaf_metadata(key: str, inner: dict) -> str:
    return json.dumps({"__spec__": [{key: "*"}, leaf_spec_json(key)], "__objects__": [key],
                       f"{key}.__metadata__": inner}, indent=4)


def _jax_array_type():
    jax = sys.modules.get("jax")
    return getattr(jax, "Array", None) if jax is not None else None


def as_tensor(leaf):
    """A torch tensor for tensor-like leaves we store as tensors (jax arrays), else None."""
    if isinstance(leaf, torch.Tensor):
        return leaf
    jax_array = _jax_array_type()
    if jax_array is not None and isinstance(leaf, jax_array):
        return numpy_to_tensor(np.array(leaf, copy=True))
    return None


def tensor_inner(tensor, compressed: bool) -> dict:
    inner = {"__TORCH__": True, "shapes": [list(tensor.shape)], "dtypes": [str(tensor.dtype)]}
    if tensor.dtype in RTFX_IDS:
        inner["rtfx_dtypes"] = [RTFX_IDS[tensor.dtype]]
    inner.update({"__TYPE__": "TorchTensorSerializer", "__NUMPY__": True, "compressed": compressed})
    return inner


def prepare_tensor(tensor):
    """The host array to write for a tensor leaf, or None for an unbuilt full tensor
    (written from its fill value). Runs in worker threads."""
    if isinstance(tensor, DeferredFullTensor) and not tensor.is_materialized:
        return None
    if isinstance(tensor, LazyTensor):
        tensor = tensor.materialize()
    return tensor_to_storage_array(tensor)


def _set_tensor_attrs(ds, tensor, compressed):
    ds.attrs["__NUMPY__"] = True
    ds.attrs["__TORCH__"] = True
    ds.attrs["__TYPE__"] = "TorchTensorSerializer"
    ds.attrs["compressed"] = compressed
    ds.attrs["dtypes"] = np.array([str(tensor.dtype)], dtype=h5py.string_dtype())
    if tensor.dtype in RTFX_IDS:
        ds.attrs["rtfx_dtypes"] = np.array([RTFX_IDS[tensor.dtype]])
    ds.attrs["shapes"] = np.array([list(tensor.shape)])


def _lz4():
    """The LZ4 filter's dataset options, or {} without hdf5plugin."""
    return dict(hdf5plugin.LZ4()) if hdf5plugin is not None else {}


def _filters(shape):
    # Every non-scalar tensor, empty ones included, goes through LZ4 in chunks of h5py's
    # guess, as the reference writes it whatever the `compressed` flag says; a scalar
    # dataset cannot be chunked.
    return {} if len(shape) == 0 else _lz4()


def _fill_array(tensor):
    fill = torch.tensor(tensor.fill_value, dtype=tensor.dtype)
    return tensor_to_storage_array(fill).astype(storage_numpy_dtype(tensor.dtype))


def deferred_full_inner(tensor) -> dict:
    """Metadata of a full tensor kept unbuilt: shape, dtype and fill value, no dataset."""
    fill = tensor.fill_value
    if fill is not None:
        fill = torch.tensor(fill, dtype=tensor.dtype).item()  # 0 for float zeros is 0.0
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype), "fill_value": fill,
            "__TYPE__": "DeferredFullTensor", "__NONE__": True}


def write_tensor(f, key, tensor, array, compressed):
    shape = tuple(tensor.shape)
    if array is None:  # DeferredFullTensor: let HDF5 write the fill value, no host copy
        dcpl = h5p.create(h5p.DATASET_CREATE)
        # Allocated and filled now, so readers that map the file see real bytes.
        dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5d.FILL_TIME_ALLOC)
        ds = f.create_dataset(key, shape=shape, dtype=storage_numpy_dtype(tensor.dtype),
                              fillvalue=_fill_array(tensor), dcpl=dcpl, **_filters(shape))
    else:
        ds = f.create_dataset(key, data=array, **_filters(shape))
    _set_tensor_attrs(ds, tensor, compressed)
    return tensor_inner(tensor, compressed)


def write_object(f, key, obj):
    try:
        data = pickle.dumps(obj, protocol=4)
    except Exception as e:
        raise TypeError(f"cannot save entry {key!r}: a {type(obj).__name__} that cannot be "
                        f"pickled ({e})") from e
    if len(data) <= _MAX_ATTR_BYTES:
        ds = f.create_dataset(key, data=h5py.Empty("f"))
        ds.attrs["__BYTES__"] = np.frombuffer(data, dtype="V1")
    else:
        ds = f.create_dataset(key, data=np.frombuffer(data, dtype=np.uint8))
        ds.attrs["__BYTES_IN_DATA__"] = True
    ds.attrs["__TYPE__"] = "ObjectSerializer"
    ds.attrs["compressed"] = False
    return {"__TYPE__": "ObjectSerializer", "__BYTES__": True, "compressed": False}


def simple_inner(leaf):
    """Metadata for leaves kept entirely in metadata, or None if the leaf is not one."""
    t = type(leaf)
    if t in (bool, int, float):
        return {"scalar_value": leaf, "__TYPE__": "ScalarSerializer", "__NONE__": True}
    if t is str:
        return {"string_value": leaf, "__TYPE__": "StringSerializer", "__NONE__": True}
    if leaf is None:
        return {"__TYPE__": "NoneSerializer", "__NONE__": True}
    return None


def link_inner(target_key):
    return {"key": target_key, "__LINKED__": True, "__TYPE__": "LinkedObject", "__NONE__": True}


# ---- reading -------------------------------------------------------------------------


class Link:
    """A leaf that is the same object as the leaf at `key`, resolved after all are read."""

    def __init__(self, key):
        self.key = key


def _tensor_dtype(inner, ds):
    if inner.get("dtypes"):
        return dtype_from_name(inner["dtypes"][0])
    if inner.get("rtfx_dtypes"):
        return dtype_from_rtfx(int(inner["rtfx_dtypes"][0]))
    return torch.from_numpy(np.zeros((0,), dtype=ds.dtype)).dtype


def read_leaf(f, source, key, inner, mode, allow_unsafe):
    """Rebuild one leaf. `mode` is "lazy", "cache" or "eager"."""
    kind = inner.get("__TYPE__")
    if kind == "TorchTensorSerializer":
        if key not in f:
            raise ValueError("its tensor dataset is missing")
        ds = f[key]
        if not isinstance(ds, h5py.Dataset) or ds.shape is None:
            raise ValueError("its tensor dataset is not an array")
        dtype = _tensor_dtype(inner, ds)
        if mode == "eager":
            return read_dataset(ds, dtype)
        return FileTensor(source, key, ds.shape, dtype, keep=_keeps(mode))
    if kind == "ScalarSerializer":
        return inner["scalar_value"]
    if kind == "StringSerializer":
        return inner["string_value"]
    if kind == "NoneSerializer":
        return None
    if kind == "LinkedObject":
        return Link(inner["key"])
    if kind == "ObjectSerializer":
        if key not in f:
            raise ValueError("its object dataset is missing")
        ds = f[key]
        if "__BYTES__" in ds.attrs:
            data = np.asarray(ds.attrs["__BYTES__"]).tobytes()
        elif ds.attrs.get("__BYTES_IN_DATA__", False):
            data = np.asarray(ds[()]).tobytes()
        else:
            raise ValueError("its object dataset holds no pickled bytes")
        return pickling.loads(data, allow_unsafe, key)
    if kind == "DeferredFullTensor":
        dtype = dtype_from_name(inner["dtype"])
        fill = inner.get("fill_value")
        return DeferredFullTensor(tuple(inner["shape"]), dtype, 0 if fill is None else fill)
    raise ValueError(f"unknown serializer type {kind!r}")
