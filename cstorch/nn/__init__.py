"""`cerebras.pytorch.nn`: layers and functions Cerebras adds beside `torch.nn`."""
from cstorch.nn import functional
from cstorch.nn.loss import SmoothL1Loss
from cstorch.nn.selective_grad import SelectiveGrad

__all__ = ["functional", "SmoothL1Loss", "SelectiveGrad"]
