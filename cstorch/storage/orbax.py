"""Orbax checkpoints: a run's device state saved shard by shard, and any nested dict of
tensors written as an Orbax pytree.

A checkpoint written here is an Orbax composite directory with two items:

- ``tree``: a `PyTreeCheckpointHandler` pytree of arrays. For a run it is a flat dict keyed
  by slot name (``model.0.weight``, ``optimizer.state.0.momentum_buffer``) whose values are
  the backend's `jax.Array`s, so every device writes the shards it owns. For a converted
  object it is the object's tensors as nested dicts, mirroring its structure.
- ``meta``: a JSON item: what kind of checkpoint this is, the step count, each tensor's
  torch dtype (JAX computes int64 as int32; the torch dtype comes back on load), and for
  converted objects the torch pytree spec, the non-tensor leaves Orbax does not store
  (ints, floats, bools, strings, None), tied tensors, and the keys that were dropped.

A run's state can be restored onto a backend with another mesh: each array is read with
the sharding the current backend gives that slot. orbax is imported on first use, so
`import cstorch` does not pay for it.
"""
import json
import os
import warnings

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

from bridge import numpy_to_tensor
from bridge import tensor_to_numpy
from bridge import to_jax_dtype
from cstorch.run import current
from cstorch.storage.dtypes import dtype_from_name
from cstorch.storage.pytree import _child_names, children, ensure_namedtuples_registered
from cstorch.storage.serializers import as_tensor

FORMAT = "cstorch.orbax"
VERSION = 1
TREE, META = "tree", "meta"
RUN_STATE, OBJECT = "run_state", "tree"


def _ocp():
    import orbax.checkpoint as ocp  # noqa: PLC0415 (heavy; only Orbax checkpoints need it)
    return ocp


def _checkpointer():
    ocp = _ocp()
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


# detection --------------------------------------------------------------------------

def is_orbax_checkpoint(path) -> bool:
    """True if `path` is a directory holding a finished Orbax checkpoint (a composite one
    with per-item folders, or a single pytree)."""
    try:
        path = os.fspath(path)
    except TypeError:
        return False
    if not isinstance(path, str) or not os.path.isdir(path):
        return False
    if os.path.exists(os.path.join(path, "_CHECKPOINT_METADATA")) or \
            os.path.exists(os.path.join(path, "_METADATA")):
        return True
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    return any(os.path.exists(os.path.join(path, e, "_METADATA")) for e in entries)


def _existing_checkpoint(path) -> str:
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise RuntimeError(f"Orbax checkpoint {path} does not exist")
    if not is_orbax_checkpoint(path):
        raise RuntimeError(f"{path} is not an Orbax checkpoint directory (no _CHECKPOINT_METADATA "
                           f"or _METADATA inside); save one with cstorch.storage.save_orbax")
    return path


def _target_path(path, overwrite) -> str:
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save Orbax checkpoint {path}: directory {parent} does not exist")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"cannot save Orbax checkpoint {path}: it already exists; remove it "
                              f"or pass overwrite=True")
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"cannot save Orbax checkpoint {path}: a file of that name exists")
    return path


def _read_meta(path):
    """Our JSON item, or None for Orbax checkpoints written by other tools."""
    meta_file = os.path.join(path, META, "metadata")
    if not os.path.isfile(meta_file):
        return None
    try:
        with open(meta_file) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"Orbax checkpoint {path}: cannot read its {META} item ({e})") from e
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _tree_metadata(path):
    """The saved arrays' metadata, as a pytree of orbax ArrayMetadata."""
    item = os.path.join(path, TREE)
    if not os.path.isdir(item):
        return {}
    return _handler_metadata(item)


# dtypes -------------------------------------------------------------------------------

def _tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    try:
        a = tensor_to_numpy(t)
        return a if a.flags.c_contiguous else a.copy()  # ascontiguousarray makes 0-d 1-d
    except TypeError as e:
        raise TypeError(f"Orbax checkpoints cannot hold tensors of dtype {t.dtype}") from e


def _numpy_to_tensor(arr, dtype_name=None) -> torch.Tensor:
    return numpy_to_tensor(np.array(arr, copy=True), dtype_from_name(dtype_name) if dtype_name else None)


# a run's device state -------------------------------------------------------------------

def _backend(backend):
    if backend is not None:
        return backend
    b = current.backend()
    if b is None:
        raise RuntimeError("no backend has been initialized; call cstorch.backend(...) and "
                           "cstorch.compile(model) before saving or loading run state")
    return b


def save_orbax(path, backend=None, *, overwrite: bool = False) -> str:
    """Save the device state of the run on `backend` (default: the current one) as an
    Orbax checkpoint directory at `path`, with the backend's step count.

    Every slot (model parameters and buffers, optimizer state, scheduler state) is written
    from its `jax.Array` by the devices that hold it. The directory appears only when the
    write is complete (Orbax writes to a temporary name and renames). An existing `path`
    is an error unless `overwrite` is true. Returns the absolute path.
    """
    ocp = _ocp()
    backend = _backend(backend)
    path = _target_path(path, overwrite)
    state = backend.state
    state.sync()
    tree, dtypes = {}, {}
    for name, cell in zip(state.names, state.cells):
        if name in tree:
            raise RuntimeError(f"cannot save run state: two state tensors share the name {name!r}")
        tree[name] = cell.array
        dtypes[name] = str(cell.dtype)
    meta = {"format": FORMAT, "version": VERSION, "kind": RUN_STATE,
            "step_count": int(backend.step_count), "backend_type": backend.backend_type,
            "mesh": {k: int(v) for k, v in backend.mesh.shape.items()}, "dtypes": dtypes}
    items = {META: ocp.args.JsonSave(meta)}
    if tree:
        items[TREE] = ocp.args.PyTreeSave(tree)
    _checkpointer().save(path, ocp.args.Composite(**items), force=overwrite)
    return path


def load_orbax(path, backend=None) -> dict:
    """Restore a checkpoint written by `save_orbax` into the run on `backend` (default:
    the current one), which may lay its state over a different mesh.

    Each array is read directly into the sharding the current backend uses for that slot.
    The checkpoint and the run must have the same slot names and shapes; a mismatch raises
    ValueError naming the keys. The torch tensors of the run show the restored values, and
    the backend's step count is set to the saved one. Returns the checkpoint's metadata
    (step count, backend type and mesh it was saved from).
    """

    ocp = _ocp()
    path = _existing_checkpoint(path)
    meta = _read_meta(path)
    if meta is None or meta.get("kind") != RUN_STATE:
        raise ValueError(f"Orbax checkpoint {path} does not hold run state (it was not written by "
                         f"cstorch.storage.save_orbax); read it with cstorch.load(path)")
    backend = _backend(backend)
    state = backend.state
    state.sync()
    saved = _tree_metadata(path)
    names = list(state.names)
    missing = [n for n in names if n not in saved]
    extra = [n for n in saved if n not in set(names)]
    if missing or extra:
        parts = []
        if extra:
            parts.append(f"the checkpoint has state the run lacks: {', '.join(extra)}")
        if missing:
            parts.append(f"the run has state the checkpoint lacks: {', '.join(missing)}")
        raise ValueError(f"cannot load Orbax checkpoint {path}: " + "; ".join(parts) +
                         ". Build the same model and optimizers (cstorch.compile, cstorch.optim) "
                         "as the run that saved it before loading")
    restore_args, target = {}, {}
    for name, cell in zip(names, state.cells):
        shape = tuple(cell.array.shape)
        saved_shape = tuple(saved[name].shape)
        if saved_shape != shape:
            raise ValueError(f"cannot load Orbax checkpoint {path}: {name!r} has shape "
                             f"{saved_shape} in the checkpoint but {shape} in the run; build the "
                             f"model with the configuration it was saved with")
        sharding = cell.array.sharding
        dtype = to_jax_dtype(cell.dtype)
        target[name] = _jax_struct(shape, dtype, sharding)
        restore_args[name] = ocp.ArrayRestoreArgs(sharding=sharding, dtype=dtype,
                                                  global_shape=shape)
    if target:
        restored = _checkpointer().restore(path, ocp.args.Composite(**{
            TREE: ocp.args.PyTreeRestore(item=target, restore_args=restore_args)}))[TREE]
        state.load(restored)
    backend.step_count = int(meta.get("step_count", 0))
    return {k: meta.get(k) for k in ("step_count", "backend_type", "mesh")}


def _jax_struct(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


# any nested object of tensors --------------------------------------------------------------

def _leaves_with_paths(spec):
    """(path tuple, dotted key) of every leaf of a torch pytree spec, in flattening order."""
    out = []

    def walk(node, prefix):
        if node.is_leaf():
            out.append(prefix)
            return
        for name, child in zip(_child_names(node), children(node)):
            walk(child, prefix + (name,))

    walk(spec, ())
    return [(p, ".".join(p) if p else "__root__") for p in out]


def _is_json_value(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def save_tree_orbax(obj, path, *, overwrite: bool = False) -> list:
    """Write a nested object of tensors (what `cstorch.load` returns) as an Orbax checkpoint.

    Tensors become arrays of an Orbax pytree of nested dicts, one level per container, so
    other Orbax users can read them by path. Python bools, ints, floats, strings and None
    are kept in the checkpoint's JSON item and the original structure (lists, tuples,
    OrderedDicts) in the torch pytree spec, so `cstorch.load` gives the object back.
    Other leaves cannot be stored: they are dropped with a warning and come back as None.
    Returns the dropped keys.
    """
    ocp = _ocp()
    path = _target_path(path, overwrite)
    ensure_namedtuples_registered(obj)
    leaves, spec = pytree.tree_flatten(obj)
    try:
        spec_json = pytree.treespec_dumps(spec)
    except Exception as e:
        raise TypeError(f"cannot save this object's structure as an Orbax checkpoint: {e}") from e
    paths = _leaves_with_paths(spec)
    keys = [k for _, k in paths]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"cannot save as Orbax: two entries flatten to the same key {dup!r}")
    tree, tensors, values, links, dropped, first = {}, {}, {}, {}, [], {}
    for (p, key), leaf in zip(paths, leaves):
        tensor = as_tensor(leaf)
        if tensor is not None:
            if id(leaf) in first:
                links[key] = first[id(leaf)]
                continue
            first[id(leaf)] = key
            if not p:
                p = ("__root__",)
            node = tree
            for name in p[:-1]:
                node = node.setdefault(name, {})
                if not isinstance(node, dict):
                    raise ValueError(f"cannot save as Orbax: {key!r} nests under a tensor")
            node[p[-1]] = _tensor_to_numpy(tensor)
            tensors[key] = {"path": list(p), "dtype": str(tensor.dtype)}
        elif _is_json_value(leaf) and not (isinstance(leaf, float) and not np.isfinite(leaf)):
            values[key] = leaf
        else:
            dropped.append(key)
    if dropped:
        warnings.warn(f"Orbax checkpoint {path}: these entries are not tensors or plain Python "
                      f"values and are not stored (they load as None): {', '.join(dropped)}",
                      stacklevel=2)
    meta = {"format": FORMAT, "version": VERSION, "kind": OBJECT, "treespec": spec_json,
            "keys": keys, "tensors": tensors, "values": values, "links": links, "dropped": dropped}
    items = {META: ocp.args.JsonSave(meta)}
    if tree:
        items[TREE] = ocp.args.PyTreeSave(tree)
    _checkpointer().save(path, ocp.args.Composite(**items), force=overwrite)
    return dropped


def _restore_numpy(item_path):
    """Every array of an Orbax pytree item, on the host."""
    ocp = _ocp()
    meta_tree = _handler_metadata(item_path)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta_tree)
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    return ckptr.restore(item_path, ocp.args.PyTreeRestore(restore_args=restore_args))


def _handler_metadata(item_path):
    ocp = _ocp()
    from etils import epath  # noqa: PLC0415 (comes with orbax, loaded only with it)
    return ocp.PyTreeCheckpointHandler().metadata(epath.Path(item_path)).tree


def _to_torch(tree):
    def convert(v):
        if isinstance(v, (np.ndarray, np.generic)):
            return _numpy_to_tensor(v)
        if hasattr(v, "__array__") and hasattr(v, "sharding"):  # a jax.Array
            return _numpy_to_tensor(np.asarray(v))
        return v
    if isinstance(tree, dict):
        return {k: _to_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_torch(v) for v in tree)
    return convert(tree)


def read_orbax(path) -> object:
    """The content of an Orbax checkpoint directory as torch tensors on the host.

    A checkpoint from `save_tree_orbax` comes back as the object that was saved; one from
    `save_orbax` as ``{"state": {slot name: tensor}, "step_count": n}``; one written by
    other Orbax code as nested dicts (one entry per item of a composite checkpoint).
    """
    path = _existing_checkpoint(path)
    meta = _read_meta(path)
    tree_dir = os.path.join(path, TREE)
    try:
        if meta is None:
            return _read_foreign(path)
        arrays = _restore_numpy(tree_dir) if os.path.isdir(tree_dir) else {}
    except RuntimeError:
        raise
    except Exception as e:
        raise RuntimeError(f"Orbax checkpoint {path} cannot be read ({type(e).__name__}: {e})") from e
    if meta.get("kind") == RUN_STATE:
        dtypes = meta.get("dtypes", {})
        order = [k for k in dtypes if k in arrays] + [k for k in arrays if k not in dtypes]
        return {"state": {k: _numpy_to_tensor(arrays[k], dtypes.get(k)) for k in order},
                "step_count": int(meta.get("step_count", 0))}
    by_key = {}
    for key, info in meta["tensors"].items():
        node = arrays
        for name in info["path"]:
            node = node[name]
        by_key[key] = _numpy_to_tensor(node, info["dtype"])
    leaves = []
    for key in meta["keys"]:
        if key in by_key:
            leaves.append(by_key[key])
        elif key in meta["links"]:
            leaves.append(by_key[meta["links"][key]])
        else:
            leaves.append(meta["values"].get(key))
    try:
        spec = pytree.treespec_loads(meta["treespec"])
    except Exception as e:
        raise RuntimeError(f"Orbax checkpoint {path} has a structure this reader cannot rebuild "
                           f"({e}); register the missing pytree node types first") from e
    return pytree.tree_unflatten(leaves, spec)


def _read_foreign(path):
    if os.path.exists(os.path.join(path, "_METADATA")):
        return _to_torch(_restore_numpy(path))
    out = {}
    for entry in sorted(os.listdir(path)):
        item = os.path.join(path, entry)
        if os.path.exists(os.path.join(item, "_METADATA")):
            out[entry] = _to_torch(_restore_numpy(item))
        elif os.path.isfile(os.path.join(item, "metadata")):
            try:
                with open(os.path.join(item, "metadata")) as f:
                    out[entry] = json.load(f)
            except (OSError, ValueError):
                pass
    return out
