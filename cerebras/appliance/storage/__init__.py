"""Checkpoint storage: readers, writers and deleters chosen by path (see `base_storage`).

Local paths use `cstorch`'s HDF5 checkpoint code; `s3://` paths are refused with an
`UnsupportedStorageError`, as only local paths are supported here.
"""
from cerebras.appliance.storage.base_storage import (
                                                     StorageDeleter,
                                                     StorageReader,
                                                     StorageWriter,
                                                     UnsupportedStorageError,
)
from cerebras.appliance.storage.h5_storage import H5Deleter, H5Reader, H5Writer
from cerebras.appliance.storage.s3_storage import S3Deleter, S3Reader, S3Writer

__all__ = ["StorageReader", "StorageWriter", "StorageDeleter", "UnsupportedStorageError",
           "H5Reader", "H5Writer", "H5Deleter", "S3Reader", "S3Writer", "S3Deleter"]
