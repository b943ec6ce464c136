"""Precision and recall of the top-k scored classes against a set of labels per example."""
import torch

from cstorch.metrics.metric import Metric


class _TopKMetric(Metric):
    def __init__(self, k: int, name: str):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(self).__name__} needs k, a positive int; got {k!r}")
        super().__init__(name)
        self.k = k
        self.register_state("total_hits")
        self.register_state("total_count")

    def _rows(self, labels, predictions):
        """`labels` as (examples, labels per example), `predictions` as (examples,
        classes), and the top k classes of each example."""
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
        labels = labels.reshape(-1, labels.shape[-1]).long()
        predictions = predictions.reshape(-1, classes)
        # Ties go to the later class, the same on every backend (torch.topk leaves the
        # order of ties unspecified): a stable descending sort of the reversed scores.
        order = torch.sort(predictions.flip(-1), dim=-1, descending=True, stable=True).indices
        top = (classes - 1) - order[:, :self.k]
        return labels, top

    def compute(self) -> torch.Tensor:
        return self.total_hits / self.total_count


class PrecisionAtKMetric(_TopKMetric):
    """Precision at k: the fraction of each example's k best-scored classes that are
    among its labels, pooled over every example seen. Before any update it is NaN.

    Call it with `labels` (class ids, shape (..., num_labels), or (...) for one label per
    example) and `predictions` (scores, shape (..., num_classes)); the k classes with the
    highest scores are the predicted ones, ties going to the later class.

    Args:
        k: how many top-scored classes are predicted per example.
        name: the name the metric is logged and registered under.
    """

    def __init__(self, k: int, name: str = "precision_at_k"):
        super().__init__(k, name)

    def update(self, labels, predictions):
        """Fold one batch of examples in."""
        labels, top = self._rows(labels, predictions)
        hits = (top.unsqueeze(-1) == labels.unsqueeze(-2)).any(-1)
        self.total_hits.add_(hits.float().sum())
        self.total_count.add_(float(top.numel()))


class RecallAtKMetric(_TopKMetric):
    """Recall at k: the fraction of labels found among their example's k best-scored
    classes, pooled over every label seen. Every label counts, a repeated one or one
    outside ``[0, num_classes)`` (never found) included. Before any update it is NaN.

    Call it with `labels` (class ids, shape (..., num_labels), or (...) for one label per
    example) and `predictions` (scores, shape (..., num_classes)); the k classes with the
    highest scores are the predicted ones, ties going to the later class.

    Args:
        k: how many top-scored classes are predicted per example.
        name: the name the metric is logged and registered under.
    """

    def __init__(self, k: int, name: str = "recall_at_k"):
        super().__init__(k, name)

    def update(self, labels, predictions):
        """Fold one batch of examples in."""
        labels, top = self._rows(labels, predictions)
        found = (labels.unsqueeze(-1) == top.unsqueeze(-2)).any(-1)
        self.total_hits.add_(found.float().sum())
        self.total_count.add_(float(labels.numel()))
