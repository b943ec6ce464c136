"""Losses of `cerebras.pytorch.nn` that are PyTorch's own, taking `use_autogen` besides.

Each class here subclasses the `torch.nn` loss of the same name: constructed with that
loss's arguments (and optionally `use_autogen`, kept as `autogen_enabled`; see
`cstorch.nn.autogen`), it computes what the PyTorch loss computes, eagerly or inside a
traced step.
"""
import torch

from cstorch.nn import ctc
from cstorch.nn.autogen import take_use_autogen
from cstorch.run.capture_context import capturing

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CTCLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "HingeEmbeddingLoss",
    "KLDivLoss",
    "L1Loss",
    "MSELoss",
    "MarginRankingLoss",
    "MultiLabelSoftMarginLoss",
    "NLLLoss",
    "PoissonNLLLoss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]


def _wrap(name: str, traced_forward=None) -> type:
    """The `torch.nn` loss `name` taking `use_autogen`; inside a traced step it computes
    with `traced_forward(self, *args, **kwargs)` where that is given."""
    base = getattr(torch.nn, name)

    def __init__(self, *args, **kwargs):
        # Set before the base's attributes, so it leads them in vars() as it does in the
        # real package.
        self.autogen_enabled = take_use_autogen(name, kwargs)
        base.__init__(self, *args, **kwargs)

    def forward(self, *args, **kwargs):
        if traced_forward is not None and capturing.get() is not None:
            return traced_forward(self, *args, **kwargs)
        return base.forward(self, *args, **kwargs)

    forward.__doc__ = base.forward.__doc__
    return type(name, (base,), {
        "__init__": __init__, "forward": forward, "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"`torch.nn.{name}`, also taking `use_autogen` (default False, kept as "
                   f"`autogen_enabled`).\n\n{base.__doc__ or ''}",
    })


BCELoss = _wrap("BCELoss")
BCEWithLogitsLoss = _wrap("BCEWithLogitsLoss")
def _ctc_forward(self, log_probs, targets, input_lengths, target_lengths):
    return ctc.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                        self.reduction, self.zero_infinity)


# PyTorch's CTC kernel sizes its work by the lengths' values; traced, a static-shape form.
CTCLoss = _wrap("CTCLoss", _ctc_forward)
CosineEmbeddingLoss = _wrap("CosineEmbeddingLoss")
CrossEntropyLoss = _wrap("CrossEntropyLoss")
HingeEmbeddingLoss = _wrap("HingeEmbeddingLoss")
KLDivLoss = _wrap("KLDivLoss")
L1Loss = _wrap("L1Loss")
MSELoss = _wrap("MSELoss")
MarginRankingLoss = _wrap("MarginRankingLoss")
MultiLabelSoftMarginLoss = _wrap("MultiLabelSoftMarginLoss")
NLLLoss = _wrap("NLLLoss")
PoissonNLLLoss = _wrap("PoissonNLLLoss")
TripletMarginLoss = _wrap("TripletMarginLoss")
TripletMarginWithDistanceLoss = _wrap("TripletMarginWithDistanceLoss")
