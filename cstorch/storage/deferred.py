"""`cstorch.storage.to_deferred`: tensors moved out of memory into a checkpoint file and
read back on use."""
import atexit
import os
import shutil
import tempfile
import threading

import torch
import torch.utils._pytree as pytree

from cstorch.run import current
from cstorch.storage.reader import load
from cstorch.storage.writer import write_checkpoint

_lock = threading.Lock()
_directory = None
_count = 0


def _next_path():
    global _directory, _count
    with _lock:
        if _directory is None:
            _directory = tempfile.mkdtemp(prefix="cstorch_deferred_")
            atexit.register(shutil.rmtree, _directory, True)
        _count += 1
        return os.path.join(_directory, f"{_count}.mdl")


def to_deferred(tensors):
    """Return `tensors` (a tensor or any nest of containers holding tensors) with every
    tensor replaced by a deferred one of the same shape, dtype and value: the data is
    written to a temporary checkpoint file (removed when the process exits) and read from
    it each time the tensor is used, so the host memory it held can be freed. Other leaves
    and the structure come back as they were; a tensor that appears twice stays one
    tensor."""
    leaves, spec = pytree.tree_flatten(tensors)
    picked = {str(i): leaf for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)}
    if not picked:
        return tensors
    path = _next_path()
    # Written on every process and outside `max_checkpoints`: the file is this process's.
    write_checkpoint(picked, path, current.backend())
    loaded = load(path)
    leaves = [loaded[str(i)] if str(i) in picked else leaf for i, leaf in enumerate(leaves)]
    return pytree.tree_unflatten(leaves, spec)


__all__ = ["to_deferred"]
