"""`cerebras.pytorch.utils`."""
import importlib

from cstorch.utils import (benchmark, call_once, data, kernel, nest, num_kv_groups, profiler,
                           tracker, utils)
from cstorch.utils.cs_config import CSConfig
from cstorch.utils.data import DataLoader, SyntheticDataset
from cstorch.utils.step_closures import checkpoint_closure, step_closure

__all__ = ["benchmark", "data", "profiler", "CSConfig", "step_closure", "checkpoint_closure",
           "call_once", "kernel", "nest", "num_kv_groups", "tracker", "utils", "DataLoader",
           "SyntheticDataset"]


def __getattr__(name):
    # `tensorboard` is imported on first use: torch.utils.tensorboard and the tensorboard
    # package would make `import cstorch` slower for every program, though few of them
    # write summaries.
    if name == "tensorboard":
        return importlib.import_module("cstorch.utils.tensorboard")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
