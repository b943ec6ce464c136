"""The streaming workers' local cache of input data (`WORKER_CACHE_ROOT`).

On a Wafer-Scale Cluster each worker node has a local disk where input data is copied
once and read from in later runs; Model Zoo's `create_worker_cache` copies a dataset
directory to `WORKER_CACHE_ROOT/<absolute source path>` after asking
`hit_worker_cache_limit` whether it fits. The emulated workers run in this process, so
the cache is a directory on this machine: `$CSTORCH_WORKER_CACHE_ROOT` where set, else
`<temp dir>/cstorch-worker-cache`, and the limit is the free space of its file system.
"""
import os
import shutil
import tempfile

WORKER_CACHE_ROOT = os.path.abspath(os.environ.get(
    "CSTORCH_WORKER_CACHE_ROOT", os.path.join(tempfile.gettempdir(), "cstorch-worker-cache")))


def tree_size(path: str) -> int:
    """Bytes of the regular files under `path` (links not followed; 0 if it is missing)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def hit_worker_cache_limit(src_dir: str, dest_dir: str) -> tuple[bool, int, int]:
    """Whether copying `src_dir` to the cache directory `dest_dir` would overflow the
    cache: returns `(is_limit_hit, dir_size, available_space_for_copy)` in bytes.

    `dir_size` is the size of the files under `src_dir`; the space available is the free
    space of `dest_dir`'s file system plus what `dest_dir` already holds (a stale copy is
    replaced by the new one)."""
    if not os.path.exists(src_dir):
        raise FileNotFoundError(f"cannot cache {src_dir}: it does not exist")
    dir_size = tree_size(src_dir)
    free = shutil.disk_usage(_existing_parent(dest_dir)).free
    available = free + tree_size(dest_dir)
    return dir_size > available, dir_size, available


__all__ = ["WORKER_CACHE_ROOT", "hit_worker_cache_limit"]
