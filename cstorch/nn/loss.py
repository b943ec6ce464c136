"""Losses of `cerebras.pytorch.nn`."""
import torch

__all__ = ["SmoothL1Loss"]


class SmoothL1Loss(torch.nn.Module):
    """Smooth L1 (Huber-like) loss, as `torch.nn.SmoothL1Loss` defines it: for each
    element, with ``d = |input - target|``,

        0.5 * d**2 / beta   where d < beta
        d - 0.5 * beta      elsewhere

    (plain L1 when `beta` is 0), then reduced by `reduction` ("mean", "sum" or "none").
    It is written with elementwise ops and a select only, so every backend lowers it the
    same way; values equal `torch.nn.functional.smooth_l1_loss`.
    """

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 beta: float = 1.0):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if beta < 0:
            raise ValueError(f"SmoothL1Loss beta must be non-negative, got {beta}")
        self.reduction = reduction
        self.beta = float(beta)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        diff = torch.abs(input - target)
        if self.beta == 0.0:
            loss = diff
        else:
            loss = torch.where(diff < self.beta, 0.5 * diff * diff / self.beta,
                               diff - 0.5 * self.beta)
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, beta={self.beta}"
