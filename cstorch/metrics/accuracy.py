"""Accuracy: the (weighted) fraction of predictions equal to their labels."""
import torch

from cstorch.metrics.metric import Metric, check_same_shape, weights_like


class AccuracyMetric(Metric):
    """The weighted fraction of predictions that equal their labels, over every batch:
    ``sum(weights * (labels == predictions)) / sum(weights)``.

    Call it with `labels`, `predictions` (class ids of the same shape) and optionally
    `weights` (broadcastable to them; a zero weight leaves a position out, as a loss mask
    does). Before any update the value is NaN (0 / 0).

    Args:
        name: the name the metric is logged and registered under (required; None
            is allowed).
    """

    def reset(self):
        self.register_state("total_correct", torch.tensor(0.0))
        self.register_state("total_weight", torch.tensor(0.0))

    def update(self, labels, predictions, weights=None, dtype=None):
        """Fold one batch in. `dtype` is the floating dtype the weighted hits are formed in
        (Model Zoo passes its logits' dtype); they are summed and accumulated in float32
        whatever it is, so a half dtype cannot saturate the counts."""
        check_same_shape(labels, predictions, type(self).__name__)
        dtype = dtype or torch.float32
        hits = (labels == predictions).to(dtype)
        w = weights_like(weights, hits, dtype)
        self.total_correct.add_((hits * w).float().sum())
        self.total_weight.add_(w.float().sum())

    def compute(self) -> torch.Tensor:
        return self.total_correct / self.total_weight
