"""`cerebras.pytorch.utils`."""
from cstorch.utils import data
from cstorch.utils.step_closures import checkpoint_closure, step_closure

__all__ = ["data", "step_closure", "checkpoint_closure"]
