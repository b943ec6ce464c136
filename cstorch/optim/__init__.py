"""`cerebras.pytorch.optim`: optimizers whose state exists before the first step."""
from cstorch.optim.optimizer import Optimizer
from cstorch.optim.sgd import SGD
from cstorch.optim.adam import Adam
from cstorch.optim.adamw import AdamW
from cstorch.optim.adamax import Adamax
from cstorch.optim.adadelta import Adadelta
from cstorch.optim.adagrad import Adagrad
from cstorch.optim.asgd import ASGD
from cstorch.optim.lamb import Lamb
from cstorch.optim.lion import Lion
from cstorch.optim.nadam import NAdam
from cstorch.optim.radam import RAdam
from cstorch.optim.rmsprop import RMSprop
from cstorch.optim.rprop import Rprop
from cstorch.optim.adafactor import Adafactor
from cstorch.optim.muon import Muon
from cstorch.optim import AdamBase  # noqa: F401  (a submodule, as in the real package)
from cstorch.optim import scheduler
from cstorch.optim import lr_scheduler
from cstorch.optim import weight_decay_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adamax", "Adadelta", "Adagrad", "ASGD", "Lamb",
           "Lion", "NAdam", "RAdam", "RMSprop", "Rprop", "Adafactor", "Muon", "scheduler", "lr_scheduler",
           "weight_decay_scheduler"]
