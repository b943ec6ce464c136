"""`cerebras.pytorch.utils`."""
from cstorch.utils import data
from cstorch.utils.cs_config import CSConfig
from cstorch.utils.step_closures import checkpoint_closure, step_closure

__all__ = ["data", "CSConfig", "step_closure", "checkpoint_closure"]
