"""Area under the ROC curve of a binary classifier, from counts at fixed thresholds."""
import torch

from cstorch.metrics.metric import Metric, check_same_shape, weights_like

# Keeps the rates finite when a class has no example; the endpoints of the thresholds
# sit this far outside [0, 1] so every score falls strictly between them.
_EPSILON = 1e-7


class AUCMetric(Metric):
    """The area under the ROC curve (true positive rate against false positive rate) of
    every batch seen, approximated at `num_thresholds` thresholds evenly spaced over
    [0, 1] (the end ones just outside it) and summed by the trapezoidal rule.

    A score counts as positive at a threshold when it is strictly above it. Call it with
    `labels` (0 or 1, or booleans: anything nonzero is positive), `predictions` (scores in
    [0, 1], the same shape) and optionally `weights` broadcastable to them. Before any
    update the value is 0.

    Args:
        num_thresholds: how many thresholds the curve is evaluated at (at least 2).
        name: the name the metric is logged and registered under.
    """

    def __init__(self, num_thresholds: int = 200, name: str = "auc"):
        if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) \
                or num_thresholds < 2:
            raise ValueError(f"AUCMetric needs num_thresholds, an int of at least 2; got "
                             f"{num_thresholds!r}")
        super().__init__(name)
        self.num_thresholds = num_thresholds
        inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self._thresholds = [-_EPSILON] + inner + [1.0 + _EPSILON]
        for name_ in ("true_positives", "false_positives", "true_negatives", "false_negatives"):
            self.register_state(name_, (num_thresholds,))

    def update(self, labels, predictions, weights=None):
        """Fold one batch in."""
        check_same_shape(labels, predictions, "AUCMetric")
        t = self.num_thresholds
        w = weights_like(weights, predictions).reshape(-1)
        positive = labels.reshape(-1) != 0
        pos_w = torch.where(positive, w, torch.zeros_like(w))
        neg_w = w - pos_w
        thresholds = torch.tensor(self._thresholds, dtype=torch.float32)
        # How many thresholds each score is above: a histogram over those counts, summed
        # from the top, gives the counts at every threshold in O(scores) memory.
        above = torch.searchsorted(thresholds, predictions.reshape(-1).float())
        hist_pos = torch.zeros(t + 1).index_add(0, above, pos_w)
        hist_neg = torch.zeros(t + 1).index_add(0, above, neg_w)
        tp = hist_pos.flip(0).cumsum(0).flip(0)[1:]
        fp = hist_neg.flip(0).cumsum(0).flip(0)[1:]
        self.true_positives.add_(tp)
        self.false_positives.add_(fp)
        self.false_negatives.add_(pos_w.sum() - tp)
        self.true_negatives.add_(neg_w.sum() - fp)

    def compute(self) -> torch.Tensor:
        tp, fp = self.true_positives, self.false_positives
        tn, fn = self.true_negatives, self.false_negatives
        tpr = tp / (tp + fn + _EPSILON)
        fpr = fp / (fp + tn + _EPSILON)
        return ((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2).sum()
