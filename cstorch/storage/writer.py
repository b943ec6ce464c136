"""`cstorch.save`: write an object as a Cerebras HDF5 checkpoint (format 0.5)."""
import os
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor

import h5py
import torch.utils._pytree as pytree
from tqdm.auto import tqdm

from cstorch.backends import csx
from cstorch.run import current
from cstorch.storage import retention
from cstorch.storage.creation import DeferredFullTensor
from cstorch.storage.pytree import ensure_namedtuples_registered, leaf_keys, stars, dumps_json
from cstorch.storage.serializers import (as_tensor, deferred_full_inner, external_source,
                                         leaf_metadata, link_inner, prepare_tensor, simple_inner,
                                         write_external_tensor, write_object, write_tensor)
from cstorch.storage.utils import renamed_keywords
from cstorch.version import __version__

FORMAT_VERSION = 0.5
_PROGRESS_MIN_BYTES = 256 << 20


def _flags():
    return bool(csx.performance.compress_weights), int(csx.performance.transfer_processes)


def _progress(total_bytes):
    if total_bytes < _PROGRESS_MIN_BYTES or not getattr(sys.stderr, "isatty", lambda: False)():
        return None
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc="Saving checkpoint", leave=False)


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@renamed_keywords(obj="state_dict", checkpoint_file="ckpt_path")
def save(state_dict, ckpt_path):
    """Write `state_dict` (typically a dict of state dicts) to `ckpt_path` in the Cerebras
    HDF5 checkpoint format. The reference document's names `obj` and `checkpoint_file`
    are accepted as keywords too.

    Tensors become datasets, each non-scalar one written in chunks through the LZ4 filter
    (so zeros take little space); `compressed` in its attributes records the flag
    `cstorch.backends.csx.performance.compress_weights`. On a CSX backend a tensor from
    `cstorch.full/zeros/ones` that was never built is written as its shape, dtype and
    fill value only. Python scalars, strings and None live in metadata; an object seen
    twice (tied weights) is stored once and linked; other values are pickled. Data goes
    to a temporary file beside the target that is renamed over it only when complete, so
    an interrupted save never leaves a partial file under the final name.
    Under `cstorch.storage.serializers.use_external_link()`, tensors loaded from another
    checkpoint and not read since are written as links to it.
    When the backend sets `max_checkpoints`, older checkpoints written by this process
    are deleted once this one is complete. In a multi-process run only the main process
    writes; on the others this does nothing (every process can `cstorch.load` the file).
    """
    backend = current.backend()
    if backend is not None and not backend.is_main_process:
        return
    path = write_checkpoint(state_dict, ckpt_path, backend)
    retention.record(path)


def write_checkpoint(obj, checkpoint_file, backend):
    """Write the file of `save` (on every process, kept whatever `max_checkpoints` says);
    return its path."""
    path = os.fspath(checkpoint_file)
    if not isinstance(path, str):
        path = os.fsdecode(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save checkpoint {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot save checkpoint {path}: it is a directory")

    ensure_namedtuples_registered(obj)
    leaves, spec = pytree.tree_flatten(obj)
    try:
        spec_json = pytree.treespec_dumps(spec)
    except Exception as e:
        raise TypeError(f"cannot save this object's structure: {e}") from e
    keys = leaf_keys(spec)
    seen_keys = set()
    for key in keys:
        if key in seen_keys:
            raise ValueError(f"cannot save: two entries flatten to the same key {key!r}")
        seen_keys.add(key)

    compressed, workers = _flags()
    # On CSX, full/zeros/ones not built yet stay what they are: a shape, a dtype and a value.
    keep_deferred = bool(getattr(backend, "is_csx", False))
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["__version__"] = FORMAT_VERSION
            f.attrs["__cstorch_version__"] = __version__
            _write_leaves(f, keys, leaves, compressed, workers, keep_deferred)
            f.attrs["__spec__"] = dumps_json([stars(obj), spec_json])
            f.attrs["__SUCCESS__"] = True
        _fsync(tmp)
        os.replace(tmp, path)
        try:
            _fsync(directory)
        except OSError:
            pass
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return path


def _write_leaves(f, keys, leaves, compressed, workers, keep_deferred):
    first_key = {}
    plan = []  # (key, leaf, tensor or None, key linked to or None)
    total = 0
    for key, leaf in zip(keys, leaves):
        if id(leaf) in first_key:
            plan.append((key, leaf, None, first_key[id(leaf)]))
            continue
        first_key[id(leaf)] = key
        if (keep_deferred and isinstance(leaf, DeferredFullTensor)
                and not leaf.is_materialized):
            plan.append((key, leaf, None, None))   # metadata only
            continue
        tensor = as_tensor(leaf)
        if tensor is not None:
            total += tensor.numel() * tensor.element_size()
        plan.append((key, leaf, tensor, None))
    # Loaded, unread tensors written as links to their file (`use_external_link`).
    external = {i: src for i, p in enumerate(plan) if p[2] is not None
                for src in [external_source(p[1])] if src is not None}

    bar = _progress(total)
    # Host copies are made by worker threads (device transfers, lazy reads) while this
    # thread writes; HDF5 allows a single writer. The window bounds memory held ahead.
    window = max(1, workers) * 2
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending = {}
        tensor_items = [i for i, p in enumerate(plan) if p[2] is not None and i not in external]
        next_submit = 0

        def fill():
            nonlocal next_submit
            while next_submit < len(tensor_items) and len(pending) < window:
                i = tensor_items[next_submit]
                pending[i] = pool.submit(prepare_tensor, plan[i][2])
                next_submit += 1

        fill()
        try:
            for i, (key, leaf, tensor, link) in enumerate(plan):
                if link is not None:
                    inner = link_inner(link)
                elif i in external:
                    inner = write_external_tensor(f, key, tensor, *external[i])
                elif tensor is not None:
                    array = pending.pop(i).result()
                    fill()
                    inner = write_tensor(f, key, tensor, array, compressed)
                    if bar is not None:
                        bar.update(tensor.numel() * tensor.element_size())
                elif isinstance(leaf, DeferredFullTensor):
                    inner = deferred_full_inner(leaf)
                else:
                    inner = simple_inner(leaf)
                    if inner is None:
                        inner = write_object(f, key, leaf)
                f.attrs[f"{key}.__metadata__"] = leaf_metadata(key, inner)
        finally:
            for fut in pending.values():
                fut.cancel()
            if bar is not None:
                bar.close()
