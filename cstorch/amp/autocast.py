"""`cstorch.amp.autocast`: the forward pass in the run's half dtype."""
import torch

from cstorch.amp.half_dtype import get_half_dtype


def autocast(enabled: bool = True, dtype=None):
    """A context manager that runs the ops inside it in mixed precision, as
    `torch.autocast` does: matmuls and convolutions in the half dtype
    (`cstorch.amp.get_half_dtype()` unless `dtype` is given), precision-sensitive ops in
    float32. It works eagerly and inside traced steps alike; a CPU backend created with
    `mixed_precision=True` applies it to every compiled module's forward pass."""
    return torch.autocast("cpu", dtype=dtype or get_half_dtype(), enabled=enabled)
