"""Precision and recall of the top-k scored classes against a set of labels per example."""
import torch

from cstorch.metrics.metric import Metric, in_traced_step, weights_like


class _TopKMetric(Metric):
    def __init__(self, k: int, name=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(self).__name__} needs k, a positive int; got {k!r}")
        self.k = k
        super().__init__(name)

    def reset(self):
        self.register_state("total_hits", torch.tensor(0.0))
        self.register_state("total_count", torch.tensor(0.0))

    def _found(self, labels, predictions, weights):
        """Per example: its weight, and how many of its labels (each occurrence of a
        repeated one counting) are among its k best-scored classes. Also the number of
        labels per example."""
        if labels.dim() == predictions.dim() - 1:
            labels = labels.unsqueeze(-1)
        if labels.dim() != predictions.dim() or labels.shape[:-1] != predictions.shape[:-1]:
            raise ValueError(
                f"{type(self).__name__}: labels of shape {tuple(labels.shape)} do not match "
                f"predictions of shape {tuple(predictions.shape)}; pass predictions as "
                "(..., num_classes) scores and labels as (..., num_labels) class ids")
        classes = predictions.shape[-1]
        if self.k > classes:
            raise ValueError(f"{type(self).__name__}: k={self.k} is more than the "
                             f"{classes} classes scored by predictions")
        w = weights_like(weights, labels[..., 0]).reshape(-1)
        per_example = labels.shape[-1]
        labels = labels.reshape(-1, per_example).long()
        predictions = predictions.reshape(-1, classes)
        # Ties go to the later class, the same on every backend (torch.topk leaves the
        # order of ties unspecified): a stable descending sort of the reversed scores.
        order = torch.sort(predictions.flip(-1), dim=-1, descending=True, stable=True).indices
        top = (classes - 1) - order[:, :self.k]
        found = (labels.unsqueeze(-1) == top.unsqueeze(-2)).any(-1).float().sum(-1)
        return w, found, per_example

    def compute(self) -> float:
        """The value, as a Python float (inside a traced step, a tensor of the step)."""
        value = self._value()
        return value if in_traced_step() else float(value)

    def _value(self) -> torch.Tensor:
        return self.total_hits / self.total_count


class PrecisionAtKMetric(_TopKMetric):
    """Precision at k: how many of each example's labels are among its k best-scored
    classes, over k, averaged over every example seen (weighted by `weights`). A label
    repeated in an example counts once per occurrence, so with repeated labels the value
    can exceed 1. `compute()` returns a Python float; before any update it is NaN.

    Call it with `labels` (class ids, shape (..., num_labels), or (...) for one label per
    example), `predictions` (scores, shape (..., num_classes)) and optionally `weights`
    (one per example, broadcastable to the examples' shape); the k classes with the
    highest scores are the predicted ones, ties going to the later class.

    Args:
        k: how many top-scored classes are predicted per example.
        name: the name the metric is logged and registered under.
    """

    def __init__(self, k: int, name=None):
        super().__init__(k, name)

    def update(self, labels, predictions, weights=None):
        """Fold one batch of examples in."""
        w, found, _ = self._found(labels, predictions, weights)
        self.total_hits.add_((w * found).sum())
        self.total_count.add_(w.sum() * self.k)


class RecallAtKMetric(_TopKMetric):
    """Recall at k: the fraction of labels found among their example's k best-scored
    classes, over every example seen (each example's labels weighted by its weight).
    Every label counts, a repeated one or one outside ``[0, num_classes)`` (never found)
    included. `compute()` returns a Python float; before any update it is NaN.

    Call it with `labels` (class ids, shape (..., num_labels), or (...) for one label per
    example), `predictions` (scores, shape (..., num_classes)) and optionally `weights`
    (one per example, broadcastable to the examples' shape); the k classes with the
    highest scores are the predicted ones, ties going to the later class.

    Args:
        k: how many top-scored classes are predicted per example.
        name: the name the metric is logged and registered under.
    """

    def __init__(self, k: int, name=None):
        super().__init__(k, name)

    def update(self, labels, predictions, weights=None):
        """Fold one batch of examples in."""
        w, found, per_example = self._found(labels, predictions, weights)
        self.total_hits.add_((w * found).sum())
        self.total_count.add_(w.sum() * per_example)
