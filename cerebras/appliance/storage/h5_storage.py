"""Local checkpoint files in the Cerebras HDF5 format, read and written by `cstorch`.

A local path is one without a URL scheme (`/runs/ckpt_10.mdl`, `ckpt.mdl`, a Path).
Readers also accept what `cstorch.load` reads besides HDF5 (files from `torch.save`,
Orbax checkpoint directories); `global_metadata` is empty for those.
"""
import os
import shutil
from typing import Any

from cerebras.appliance.storage.base_storage import (
    PathLike,
    StorageDeleter,
    StorageReader,
    StorageWriter,
    path_scheme,
)

# Root attributes that describe the saved tree rather than the checkpoint as a whole.
_PER_TREE_ATTRS = ("__spec__",)


def _is_local(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and path_scheme(path) == "" and os.fspath(path) != ""


def _plain(value):
    """An HDF5 attribute value as a plain Python value."""
    if isinstance(value, bytes):
        return value.decode()
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        value = item()
        return value.decode() if isinstance(value, bytes) else value
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


class H5Reader(StorageReader):
    """Reads a local checkpoint through `cstorch.load`.

    - `fstat`: `os.stat` of the path; `global_metadata`: the file's root attributes
      (`__version__`, `__cstorch_version__`, `__SUCCESS__`), per-entry metadata left out.
    - `keys()`: the dotted key of every entry (`model.0.weight`), in saved order;
      `read(key)` one entry; `load(map_location=None)` the whole object, as `cstorch.load`.
    Tensors are read from the file when used (`cstorch.load`'s lazy mode) until `close()`.
    """

    def __init__(self, path: PathLike):
        if not _is_local(path):
            raise ValueError(f"H5Reader reads local paths, got {os.fspath(path)!r}; use "
                             f"StorageReader.get(path) to pick the reader for a path")
        super().__init__(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"checkpoint {self.path} does not exist")
        self._entries: dict[str, Any] | None = None

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        return _is_local(path) and os.path.exists(os.fspath(path))

    @property
    def fstat(self) -> os.stat_result:
        return os.stat(self.path)

    @property
    def global_metadata(self) -> dict[str, Any]:
        import h5py  # noqa: PLC0415 (the appliance loads cstorch on first use)

        if os.path.isdir(self.path) or not h5py.is_hdf5(self.path):
            return {}
        with h5py.File(self.path, "r") as f:
            return {name: _plain(value) for name, value in f.attrs.items()
                    if not name.endswith(".__metadata__") and name not in _PER_TREE_ATTRS}

    def load(self, map_location=None, **kwargs):
        """The whole checkpoint, exactly as `cstorch.load(path, map_location, ...)`."""
        import cstorch  # noqa: PLC0415 (the appliance loads cstorch on first use)

        return cstorch.load(self.path, map_location=map_location, **kwargs)

    def _index(self) -> dict[str, Any]:
        if self._entries is None:
            import torch.utils._pytree as pytree  # noqa: PLC0415 (loaded on first use)

            from cstorch.storage.pytree import leaf_keys  # noqa: PLC0415 (loaded on first use)

            leaves, spec = pytree.tree_flatten(self.load())
            self._entries = dict(zip(leaf_keys(spec), leaves))
        return self._entries

    def keys(self) -> list[str]:
        return list(self._index())

    def __contains__(self, key) -> bool:
        return key in self._index()

    def read(self, key: str):
        """The entry saved under the dotted `key` (see `keys()`)."""
        entries = self._index()
        if key not in entries:
            near = [k for k in entries if key in k or k in key][:5]
            raise KeyError(f"checkpoint {self.path} has no entry {key!r}"
                           + (f"; similar keys: {near}" if near else f"; it has {len(entries)} "
                              f"entries, see H5Reader.keys()"))
        return entries[key]

    def close(self) -> None:
        self._entries = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False


class H5Writer(StorageWriter):
    """Writes a local checkpoint through `cstorch.save` (atomic: a temporary file renamed
    into place when complete).

    `write(obj)` saves an object at once. Alternatively set entries with
    `writer[key] = value` and they are saved together as one dict when the writer is
    closed (`close()` or the end of a `with` block without an exception).
    """

    def __init__(self, path: PathLike):
        if not _is_local(path):
            raise ValueError(f"H5Writer writes local paths, got {os.fspath(path)!r}; use "
                             f"StorageWriter.get(path) to pick the writer for a path")
        super().__init__(path)
        self._pending: dict[str, Any] = {}

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        return _is_local(path) and os.path.exists(os.fspath(path))

    def write(self, obj) -> None:
        import cstorch  # noqa: PLC0415 (the appliance loads cstorch on first use)

        cstorch.save(obj, self.path)

    def __setitem__(self, key: str, value) -> None:
        self._pending[key] = value

    def close(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, {}
            self.write(pending)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc_info):
        if exc_type is None:
            self.close()
        else:
            # A failed block must not leave a checkpoint that looks complete.
            self._pending.clear()
        return False


class H5Deleter(StorageDeleter):
    """Deletes a local checkpoint: a file, or a directory (an Orbax checkpoint) with its
    contents. A path that no longer exists is left alone, so cleaning up after a user
    removed a checkpoint by hand does not stop a run."""

    def __init__(self, path: PathLike):
        if not _is_local(path):
            raise ValueError(f"H5Deleter deletes local paths, got {os.fspath(path)!r}")
        super().__init__(path)

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        return _is_local(path)

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        return _is_local(path) and os.path.lexists(os.fspath(path))

    def delete(self) -> None:
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            shutil.rmtree(self.path)
        else:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


__all__ = ["H5Reader", "H5Writer", "H5Deleter"]
