"""The weighted mean of every value seen."""
import torch

from cstorch.metrics.metric import Metric, as_tensor, weights_like


class MeanMetric(Metric):
    """``sum(weight * value) / sum(weight)`` over every element of every update.

    Call it with `value` (a number or a tensor; each element counts) and optionally
    `weight` (a number or a tensor broadcastable to `value`; 1 per element by default).
    Before any update the value is NaN (0 / 0).

    Args:
        name: the name the metric is logged and registered under (required; None is
            allowed).
    """

    def reset(self):
        self.register_state("total_value", torch.tensor(0.0))
        self.register_state("total_weight", torch.tensor(0.0))

    def update(self, value, weight=1.0, dtype=None):
        """Fold `value` (weighted by `weight`) in. `dtype` is the floating dtype the value
        and weights are taken in before their products are summed; the sums accumulate
        in float32 whatever it is."""
        dtype = dtype or torch.float32
        value = as_tensor(value, dtype)
        w = weights_like(weight, value, dtype)
        self.total_value.add_((value * w).float().sum())
        self.total_weight.add_(w.float().sum())

    def compute(self) -> torch.Tensor:
        return self.total_value / self.total_weight
