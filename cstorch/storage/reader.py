"""`cstorch.load`: read a Cerebras HDF5 checkpoint, or fall back to `torch.load`."""
import collections
import json
import os
import pickle

import h5py
import torch
import torch.utils._pytree as pytree

from cstorch.storage import orbax as _orbax
from cstorch.storage import pickling
from cstorch.storage.lazy import FileSource
from cstorch.storage.pytree import children, leaf_keys
from cstorch.storage.serializers import Link, read_leaf
from cstorch.storage.utils import renamed_keywords

try:  # registers the LZ4 filter with HDF5, needed for compressed checkpoints
    import hdf5plugin  # noqa: F401
except ImportError:  # pragma: no cover
    hdf5plugin = None

_SAFE_FACTORIES = {list, dict, set, int, float, str, tuple, bytes, frozenset,
                   collections.OrderedDict, collections.Counter, collections.deque}


def _mode(map_location):
    if map_location is None:
        return "lazy"
    if isinstance(map_location, str) and map_location == "cache":
        return "cache"
    if isinstance(map_location, (str, torch.device)):
        try:
            torch.device(map_location)
        except Exception as e:
            raise ValueError(f"map_location {map_location!r} is not None, 'cache' or a device: {e}") from e
        return "eager"
    if isinstance(map_location, dict) or callable(map_location):
        return "eager"
    raise TypeError(f"map_location must be None, 'cache', a device, a dict or a callable, "
                    f"got {type(map_location).__name__}")


def _relocate(t, map_location):
    if map_location is None or (isinstance(map_location, str) and map_location in ("cpu", "cache")):
        return t
    if isinstance(map_location, (str, torch.device)):
        return t.to(map_location)
    if isinstance(map_location, dict):
        target = map_location.get("cpu", "cpu")
        return t if target == "cpu" else t.to(target)
    # A callable, as in torch.load: called with the storage and its location "cpu".
    result = map_location(t.untyped_storage(), "cpu")
    if result is None:
        return t
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, torch.TypedStorage):
        result = result.untyped_storage()
    if isinstance(result, torch.UntypedStorage):
        out = torch.empty((0,), dtype=t.dtype, device=result.device)
        return out.set_(result, t.storage_offset(), t.shape, t.stride())
    raise TypeError(f"map_location callable returned {type(result).__name__}, "
                    f"expected a storage, a tensor or None")


def _check_factories(spec, allow_unsafe, name):
    if spec.is_leaf():
        return
    if spec.type is collections.defaultdict:
        factory = spec.context[0]
        if factory is not None and factory not in _SAFE_FACTORIES and not allow_unsafe:
            raise pickling.UnsafePickleError(
                f"checkpoint {name} holds a defaultdict whose default_factory is {factory!r}, "
                f"which is not known to be safe; if you trust the file, load it with "
                f"cstorch.load(path, {pickling.OPT_IN}=True)")
    for child in children(spec):
        _check_factories(child, allow_unsafe, name)


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


@renamed_keywords(checkpoint_file="ckpt_path")
def load(ckpt_path, map_location=None, **kwargs):
    """Read a checkpoint written by `cstorch.save` (or by `torch.save`).

    `map_location`: None returns tensors that are read from the file each time they are
    used; "cache" reads each once, on first use, and keeps it; "cpu" reads everything
    now; a device, dict or callable (as in `torch.load`) reads everything now and moves
    it. Python values and containers come back as their own types, and an object saved
    under several keys comes back as one object. Pickled objects are restored only for
    a list of plain data types; pass `allow_unsafe_pickle=True` to restore others from a
    file you trust. Other keyword arguments go to `torch.load` for files that are not
    HDF5 checkpoints. Raises RuntimeError if the file is missing or unreadable.
    """
    allow_unsafe = bool(kwargs.pop(pickling.OPT_IN, False))
    mode = _mode(map_location)
    if hasattr(ckpt_path, "read"):
        name = getattr(ckpt_path, "name", repr(ckpt_path))
        is_h5 = _peek_hdf5(ckpt_path)
        target = ckpt_path
    else:
        name = os.fspath(ckpt_path)
        if not os.path.exists(name):
            raise RuntimeError(f"checkpoint {name} does not exist")
        if os.path.isdir(name):
            if _orbax.is_orbax_checkpoint(name):
                # Orbax data is read eagerly: it has no lazily read tensors.
                result = _orbax.read_orbax(name)
                if map_location not in (None, "cpu", "cache"):
                    result = pytree.tree_map_only(
                        torch.Tensor, lambda t: _relocate(t, map_location), result)
                return result
            raise RuntimeError(f"checkpoint {name} is a directory, not a checkpoint file")
        try:
            is_h5 = h5py.is_hdf5(name)
        except Exception:
            is_h5 = False
        target = name
    if is_h5:
        return _load_hdf5(target, name, mode, map_location, allow_unsafe)
    return _load_torch(target, name, map_location, allow_unsafe, kwargs)


def _peek_hdf5(fileobj):
    pos = fileobj.tell()
    head = fileobj.read(8)
    fileobj.seek(pos)
    return head == b"\x89HDF\r\n\x1a\n"


def _load_torch(target, name, map_location, allow_unsafe, kwargs):
    if allow_unsafe:
        kwargs.setdefault("weights_only", False)
    loc = None if isinstance(map_location, str) and map_location == "cache" else map_location
    try:
        return torch.load(target, map_location=loc, **kwargs)
    except Exception as e:
        hint = ""
        if isinstance(e, pickle.UnpicklingError) and "weights_only" in str(e):
            hint = f"; if you trust the file, pass {pickling.OPT_IN}=True"
        raise RuntimeError(
            f"checkpoint {name} is not a cstorch HDF5 checkpoint and torch.load cannot read it "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}){hint}") from e


def _load_hdf5(target, name, mode, map_location, allow_unsafe):
    try:
        f = h5py.File(target, "r")
    except Exception as e:
        raise RuntimeError(f"checkpoint {name} is an HDF5 file that cannot be opened "
                           f"(truncated or corrupted?): {e}") from e
    source = FileSource(f, name)
    try:
        result = _read_tree(f, source, name, mode, allow_unsafe)
    except BaseException:
        source.close()
        raise
    if mode == "eager":
        source.close()
        if map_location not in (None, "cpu"):
            result = pytree.tree_map_only(torch.Tensor, lambda t: _relocate(t, map_location), result)
    return result


def _read_tree(f, source, name, mode, allow_unsafe):
    try:
        attrs = f.attrs
        if "__spec__" not in attrs or "__version__" not in attrs:
            raise RuntimeError(f"{name} is an HDF5 file but not a cstorch checkpoint "
                               f"(no __spec__/__version__ attributes)")
        if not bool(attrs.get("__SUCCESS__", False)):
            raise RuntimeError(f"checkpoint {name} is incomplete: it has no __SUCCESS__ mark "
                               f"(the save that wrote it did not finish)")
        _, spec_json = json.loads(_text(attrs["__spec__"]))
        try:
            spec = pytree.treespec_loads(spec_json)
        except Exception as e:
            raise RuntimeError(f"checkpoint {name} has a structure this reader cannot rebuild "
                               f"({e}); register the missing pytree node types first") from e
    except RuntimeError:
        raise
    except Exception as e:
        raise RuntimeError(f"checkpoint {name} is corrupted: cannot read its header ({e})") from e
    _check_factories(spec, allow_unsafe, name)

    keys = leaf_keys(spec)
    values = {}
    for key in keys:
        try:
            meta = json.loads(_text(attrs[f"{key}.__metadata__"]))
            inner = meta[f"{key}.__metadata__"]
            values[key] = read_leaf(f, source, key, inner, mode, allow_unsafe)
        except pickling.UnsafePickleError:
            raise
        except Exception as e:
            raise RuntimeError(f"checkpoint {name}: cannot read entry {key!r} "
                               f"({type(e).__name__}: {e})") from e

    def resolve(key, depth=0):
        value = values[key]
        if isinstance(value, Link):
            if value.key not in values or depth > len(values):
                raise RuntimeError(f"checkpoint {name}: entry {key!r} links to missing "
                                   f"entry {value.key!r}")
            value = resolve(value.key, depth + 1)
        return value

    leaves = [resolve(k) for k in keys]
    return pytree.tree_unflatten(leaves, spec)
