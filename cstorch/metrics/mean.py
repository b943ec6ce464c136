"""The weighted mean of every value seen."""
import torch

from cstorch.metrics.metric import Metric, as_tensor, weights_like


class MeanMetric(Metric):
    """``sum(weight * value) / sum(weight)`` over every element of every update.

    Call it with `value` (a number or a tensor; each element counts) and optionally
    `weight` (a number or a tensor broadcastable to `value`; by default 1 per element).
    Before any update the value is NaN (0 / 0).

    Args:
        name: the name the metric is logged and registered under.
    """

    def __init__(self, name: str = "mean"):
        super().__init__(name)
        self.register_state("total_value")
        self.register_state("total_weight")

    def update(self, value, weight=None):
        """Fold `value` (weighted by `weight`) in."""
        value = as_tensor(value)
        w = weights_like(weight, value)
        self.total_value.add_((value * w).sum())
        self.total_weight.add_(w.sum())

    def compute(self) -> torch.Tensor:
        return self.total_value / self.total_weight
