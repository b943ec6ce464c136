"""Checkpoints: `cstorch.save` and `cstorch.load` in the Cerebras HDF5 format."""
from cstorch.storage.hdf5 import load, save

__all__ = ["save", "load"]
