"""Checkpoints: `cstorch.save` and `cstorch.load` in the Cerebras HDF5 format, and the
lazily initialised creation ops `full`, `zeros`, `ones` (and `_like`)."""
from cstorch.storage import constants, serializers, utils
from cstorch.storage.creation import (DeferredFullTensor, full, full_like, ones, ones_like, zeros,
                                      zeros_like)
from cstorch.storage.deferred import to_deferred
from cstorch.storage.lazy import LazyTensor
from cstorch.storage.orbax import is_orbax_checkpoint, load_orbax, save_orbax, save_tree_orbax
from cstorch.storage.pickling import UnsafePickleError
from cstorch.storage.reader import load
from cstorch.storage.writer import save

__all__ = ["constants", "serializers", "utils", "to_deferred", "save", "load", "full", "full_like",
           "ones", "ones_like", "zeros", "zeros_like",
           "LazyTensor", "DeferredFullTensor", "UnsafePickleError",
           "save_orbax", "load_orbax", "save_tree_orbax", "is_orbax_checkpoint"]
