"""`s3://` paths: recognised, and refused.

This project reads and writes local paths only; it has no S3 client. `is_valid_path`
answers for `s3://` paths so that callers route them here, and everything that would
touch S3 (building a reader, writer or deleter, `path_exists`) raises
`UnsupportedStorageError` saying what to do instead.
"""
import os

from cerebras.appliance.storage.base_storage import (
    PathLike,
    StorageDeleter,
    StorageReader,
    StorageWriter,
    UnsupportedStorageError,
    path_scheme,
)


def _refuse(path, action):
    raise UnsupportedStorageError(
        f"cannot {action} {os.fspath(path)}: S3 storage is not supported; only local paths "
        f"are supported by this project. Copy the checkpoint to a local disk (for example "
        f"`aws s3 cp {os.fspath(path)} ./`) and use the local path, or save to a local path "
        f"and upload it afterwards.")


class _S3:
    _action = "access"

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        return isinstance(path, (str, os.PathLike)) and path_scheme(path) == "s3"

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        _refuse(path, "check whether this exists:")

    def __init__(self, path: PathLike, *args, **kwargs):
        _refuse(path, self._action)


class S3Reader(_S3, StorageReader):
    """Refuses `s3://` paths (only local paths are supported)."""
    _action = "read"


class S3Writer(_S3, StorageWriter):
    """Refuses `s3://` paths (only local paths are supported)."""
    _action = "write"


class S3Deleter(_S3, StorageDeleter):
    """Refuses `s3://` paths (only local paths are supported)."""
    _action = "delete"


__all__ = ["S3Reader", "S3Writer", "S3Deleter"]
