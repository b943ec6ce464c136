"""`InverseSquareRootDecayLR`: the Transformer's inverse square root decay."""
import torch

from cstorch.optim.lr_scheduler.scheduler import LRScheduler


class InverseSquareRootDecayLR(LRScheduler):
    """``initial * scale / sqrt(max(t, warmup_steps))``: constant for ``warmup_steps``
    steps, then decaying as ``1 / sqrt(t)``."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 initial_learning_rate=1.0, scale=1.0, warmup_steps=1.0,
                 param_group_tags=None):
        self.initial_learning_rate = initial_learning_rate
        self.scale = scale
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, None, param_group_tags=param_group_tags)

    def lr_at(self, step):
        return self.initial_learning_rate * self.scale * torch.rsqrt(
            torch.clamp(step, min=float(self.warmup_steps)))
