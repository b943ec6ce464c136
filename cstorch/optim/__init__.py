"""`cerebras.pytorch.optim`: optimizers whose state exists before the first step."""
from cstorch.optim.optimizer import Optimizer
from cstorch.optim.sgd import SGD

__all__ = ["Optimizer", "SGD"]
