"""`cerebras.pytorch.nn`: losses, layers and functions Cerebras adds beside `torch.nn`."""
from cstorch.nn import functional
from cstorch.nn.dice import DiceCELoss, DiceLoss
from cstorch.nn.loss import GaussianNLLLoss, HuberLoss, MultiMarginLoss, SmoothL1Loss
from cstorch.nn.scope import Scope
from cstorch.nn.selective_grad import SelectiveGrad
from cstorch.nn.tensors import Buffer, Parameter
from cstorch.nn.torch_losses import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss,
                                     CrossEntropyLoss, CTCLoss, HingeEmbeddingLoss, KLDivLoss,
                                     L1Loss, MarginRankingLoss, MSELoss,
                                     MultiLabelSoftMarginLoss, NLLLoss, PoissonNLLLoss,
                                     TripletMarginLoss, TripletMarginWithDistanceLoss)

__all__ = [
    "functional", "SelectiveGrad", "Scope", "Buffer", "Parameter",
    "BCELoss", "BCEWithLogitsLoss", "CTCLoss", "CosineEmbeddingLoss", "CrossEntropyLoss",
    "DiceCELoss", "DiceLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "HuberLoss",
    "KLDivLoss", "L1Loss", "MSELoss", "MarginRankingLoss", "MultiLabelSoftMarginLoss",
    "MultiMarginLoss", "NLLLoss", "PoissonNLLLoss", "SmoothL1Loss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
