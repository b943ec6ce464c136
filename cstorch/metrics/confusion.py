"""Metrics of a classifier's confusion matrix: F-beta, mean IoU, Dice, per-class accuracy.

Each accumulates one `num_classes x num_classes` matrix (rows: labels, columns:
predictions) and derives its value from it when computed. A class whose score is 0 / 0
(it never occurs) is left out of the mean over classes, except in the F-beta score, where
it scores 0 as scikit-learn's `zero_division=0` does.
"""
import torch

from cstorch.metrics.metric import Metric, check_same_shape, safe_div, weights_like


class _ConfusionMatrixMetric(Metric):
    """A metric computed from the confusion matrix of every batch seen."""

    def __init__(self, num_classes: int, name=None):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"'num_classes' should be at least 2, got {num_classes}")
        self.num_classes = num_classes
        super().__init__(name)

    def reset(self):
        n = self.num_classes
        self.register_state("confusion_matrix", torch.zeros((n, n)))

    def update(self, labels, predictions, weights=None, dtype=None):
        """Fold one batch in: `labels` and `predictions` are class ids of the same shape,
        `weights` (optional) broadcast to them. `dtype` is the floating dtype the weights
        are taken in (Model Zoo passes its logits' dtype); the counts accumulate in float32
        whatever it is. A position whose label or prediction is outside
        ``[0, num_classes)`` (a padding id such as -100) is not counted; this cannot be
        checked on the device, where the update runs without reading values."""
        check_same_shape(labels, predictions, type(self).__name__)
        n = self.num_classes
        w = weights_like(weights, labels, dtype or torch.float32).float().reshape(-1)
        labels = labels.reshape(-1).long()
        predictions = predictions.reshape(-1).long()
        valid = (labels >= 0) & (labels < n) & (predictions >= 0) & (predictions < n)
        # A scatter rather than one-hot products: counts stay exact and no matmul precision
        # policy of the backend applies to them.
        index = torch.where(valid, labels * n + predictions, torch.zeros_like(labels))
        w = torch.where(valid, w, torch.zeros_like(w))
        counts = torch.zeros(n * n, dtype=torch.float32).index_add(0, index, w)
        self.confusion_matrix.add_(counts.reshape(n, n))

    def _counts(self):
        """Per class: true positives, false positives, false negatives."""
        cm = self.confusion_matrix
        tp = torch.diagonal(cm)
        return tp, cm.sum(0) - tp, cm.sum(1) - tp


def _mean_over_present(scores, present):
    """Mean of `scores` over the classes where `present`; 0 when none is."""
    present = present.float()
    return safe_div((scores * present).sum(), present.sum())


def _kept_classes(num_classes, ignored, metric, argument):
    """The class ids not in `ignored`, checked: each ignored id is a class, and at least
    one class is left to score."""
    ignored = sorted(set(int(c) for c in (ignored or [])))
    outside = [c for c in ignored if not 0 <= c < num_classes]
    if outside:
        raise ValueError(f"{metric}: {argument} {outside} are not class ids of the "
                         f"{num_classes} classes")
    kept = [c for c in range(num_classes) if c not in ignored]
    if not kept:
        raise ValueError(f"{metric}: {argument} {ignored} leave none of the {num_classes} "
                         "classes to score")
    return kept


def _scored_mask(num_classes, ignored, metric):
    """A boolean vector, True for the classes a mean over classes counts."""
    kept = _kept_classes(num_classes, ignored, metric, "ignore_classes")
    return torch.tensor([c in kept for c in range(num_classes)])


class FBetaScoreMetric(_ConfusionMatrixMetric):
    """The F-beta score, ``(1 + beta^2) * precision * recall / (beta^2 * precision +
    recall)``, of every batch seen.

    `average_type` "micro" pools the true positives, false positives and false negatives
    of every class before scoring; "macro" scores each class and averages the scores
    (a class with no true positive, predicted or labelled, scores 0). Classes in
    `ignore_labels` are left out of both. Before any update the value is 0.

    Args:
        num_classes: the number of classes; labels and predictions are ids in
            ``[0, num_classes)``.
        beta: the weight of recall relative to precision (1: the F1 score).
        average_type: "micro" or "macro".
        ignore_labels: class ids left out of the score (a padding or "other" class).
        name: the name the metric is logged and registered under.
    """

    def __init__(self, num_classes: int, beta: float = 1.0, average_type: str = "micro",
                 ignore_labels=None, name=None):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"'num_classes' should be at least 2, got {num_classes}")
        if not beta > 0:
            raise ValueError(f"'beta' should be a positive number, got {beta}")
        if average_type not in ("micro", "macro"):
            raise ValueError(f"The average_type has to be one of ['micro', 'macro'], got "
                             f"{average_type}.")
        self.beta = float(beta)
        self.average_type = average_type
        self.ignore_labels = list(ignore_labels or [])
        self._kept = _kept_classes(num_classes, self.ignore_labels, "FBetaScoreMetric",
                                   "ignore_labels")
        super().__init__(num_classes, name)

    def update(self, labels, predictions, dtype=None):
        """Fold one batch in: `labels` and `predictions` are class ids of the same shape
        (this metric takes no weights). `dtype` is the floating dtype the counts are
        formed in; they accumulate in float32 whatever it is. A position whose label or
        prediction is outside ``[0, num_classes)`` is not counted."""
        super().update(labels, predictions, None, dtype)

    def compute(self) -> torch.Tensor:
        b2 = self.beta ** 2
        kept = torch.tensor(self._kept)
        tp, fp, fn = (c.index_select(0, kept) for c in self._counts())
        if self.average_type == "micro":
            tp, fp, fn = tp.sum(), fp.sum(), fn.sum()
        precision, recall = safe_div(tp, tp + fp), safe_div(tp, tp + fn)
        score = safe_div((1 + b2) * precision * recall, b2 * precision + recall)
        return score.mean()


class MeanIOUMetric(_ConfusionMatrixMetric):
    """The mean over classes of the intersection over union, ``tp / (tp + fp + fn)``, of
    every batch seen (segmentation masks or any class ids). Classes that never occur,
    in labels or predictions, and classes in `ignore_classes` are left out of the mean
    (their positions still count as false positives or negatives of the other classes);
    before any update it is 0.

    Args:
        num_classes: the number of classes.
        ignore_classes: class ids left out of the mean (a background class).
        name: the name the metric is logged and registered under.
    """

    def __init__(self, num_classes: int, ignore_classes=None, name=None):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"'num_classes' should be at least 2, got {num_classes}")
        self.ignore_classes = list(ignore_classes or [])
        self._scored = _scored_mask(num_classes, self.ignore_classes, "MeanIOUMetric")
        super().__init__(num_classes, name)

    def compute(self) -> torch.Tensor:
        tp, fp, fn = self._counts()
        union = tp + fp + fn
        return _mean_over_present(safe_div(tp, union), (union > 0) & self._scored)


class DiceCoefficientMetric(_ConfusionMatrixMetric):
    """The mean over classes of the Dice coefficient, ``2 tp / (2 tp + fp + fn)``, of
    every batch seen. Classes that never occur and classes in `ignore_classes` are left
    out of the mean (their positions still count as false positives or negatives of the
    other classes); before any update it is 0.

    Args:
        num_classes: the number of classes.
        ignore_classes: class ids left out of the mean (a background class).
        name: the name the metric is logged and registered under.
    """

    def __init__(self, num_classes: int, ignore_classes=None, name=None):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"'num_classes' should be at least 2, got {num_classes}")
        self.ignore_classes = list(ignore_classes or [])
        self._scored = _scored_mask(num_classes, self.ignore_classes, "DiceCoefficientMetric")
        super().__init__(num_classes, name)

    def compute(self) -> torch.Tensor:
        tp, fp, fn = self._counts()
        total = 2 * tp + fp + fn
        return _mean_over_present(safe_div(2 * tp, total), (total > 0) & self._scored)


class MeanPerClassAccuracyMetric(_ConfusionMatrixMetric):
    """The mean over classes of each class's accuracy (its recall, ``tp / (tp + fn)``)
    over every batch seen. Classes with no label are left out of the mean; before any
    update it is 0.

    Args:
        num_classes: the number of classes.
        name: the name the metric is logged and registered under.
    """

    def __init__(self, num_classes: int, name=None):
        super().__init__(num_classes, name)

    def compute(self) -> torch.Tensor:
        tp, _, fn = self._counts()
        support = tp + fn
        return _mean_over_present(safe_div(tp, support), support > 0)
