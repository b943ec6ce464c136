"""Storage readers, writers and deleters, chosen by the form of a path.

`StorageReader`, `StorageWriter` and `StorageDeleter` pick the backend that handles a
path: `get_type(path)` names it, `get(path)` builds it, `is_valid_path(path)` and
`path_exists(path)` ask it. Two backends exist: local files (`H5Reader`, `H5Writer`,
`H5Deleter`, over `cstorch.save`/`cstorch.load`) and S3 (`S3Reader`, ...), which
recognises `s3://` paths only to refuse them: this project reads and writes local paths.
"""
import os
import re

PathLike = str | os.PathLike

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def path_scheme(path: PathLike) -> str:
    """The URL scheme of `path` in lower case ("s3"), or "" for a local path."""
    match = _SCHEME.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return match.group(1).lower() if match else ""


class UnsupportedStorageError(NotImplementedError):
    """A path names storage this project cannot reach (S3 or another remote store)."""


class _Storage:
    """What the three roles share: a registry of backends and dispatch on the path."""

    _role: str = ""
    _backends: list[type["_Storage"]] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if _Storage in cls.__bases__:
            # A role (StorageReader, ...): it starts its own registry of backends.
            cls._backends = []
        else:
            for base in cls.__mro__[1:]:
                if _Storage in base.__bases__:
                    base._backends.append(cls)
                    break

    @classmethod
    def _is_role(cls) -> bool:
        return _Storage in cls.__bases__

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        """Whether this backend (for a role: any of its backends) handles `path`."""
        if cls._is_role():
            return any(b.is_valid_path(path) for b in cls._backends)
        raise NotImplementedError(f"{cls.__name__} must define is_valid_path")

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        """Whether something exists at `path`."""
        if cls._is_role():
            return cls.get_type(path).path_exists(path)
        raise NotImplementedError(f"{cls.__name__} must define path_exists")

    @classmethod
    def get_type(cls, path: PathLike) -> type:
        """The backend class that handles `path`."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"a storage path must be a str or os.PathLike, got {path!r}")
        candidates = cls._backends if cls._is_role() else [cls]
        for backend in candidates:
            if backend.is_valid_path(path):
                return backend
        raise UnsupportedStorageError(
            f"{os.fspath(path)}: no {cls._role or cls.__name__} handles "
            f"'{path_scheme(path)}://' paths; only local paths are supported here")

    @classmethod
    def get(cls, path: PathLike, *args, **kwargs):
        """An instance of the backend that handles `path`."""
        return cls.get_type(path)(path, *args, **kwargs)

    def __init__(self, path: PathLike):
        self.path = os.fspath(path)

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


class StorageReader(_Storage):
    """Reads a checkpoint. `StorageReader.get(path)` gives the reader for `path`."""
    _role = "storage reader"


class StorageWriter(_Storage):
    """Writes a checkpoint. `StorageWriter.get(path)` gives the writer for `path`."""
    _role = "storage writer"


class StorageDeleter(_Storage):
    """Deletes a checkpoint: `StorageDeleter.get(path).delete()`."""
    _role = "storage deleter"

    def delete(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define delete")


__all__ = ["StorageReader", "StorageWriter", "StorageDeleter", "UnsupportedStorageError",
           "path_scheme"]
