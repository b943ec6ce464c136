"""Area under the ROC or precision-recall curve of a binary classifier, from counts at
fixed thresholds."""
import torch

from cstorch.metrics.metric import Metric, check_same_shape, in_traced_step, weights_like

# The end thresholds sit this far outside [0, 1] so every score in [0, 1] falls strictly
# between them.
_EPSILON = 1e-7
_CURVES = ("ROC", "PR")
_SUMMATION_METHODS = ["interpolation", "majoring", "minoring"]


def _div_no_nan(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """`num / den`, 0 where `den` is 0."""
    zero = den == 0
    return torch.where(zero, torch.zeros_like(num), num / torch.where(zero, torch.ones_like(den),
                                                                         den))


class AUCMetric(Metric):
    """The area under a curve of a binary classifier over every batch seen: the ROC curve
    (true positive rate against false positive rate) or the precision-recall curve,
    approximated from the confusion counts at a set of thresholds and summed by a
    Riemann sum.

    A score counts as positive at a threshold when it is strictly above it. Call it with
    `labels` (0 or 1, or booleans: anything nonzero is positive), `predictions` (scores in
    [0, 1], the same shape) and optionally `weights` broadcastable to them. `compute()`
    returns a Python float; before any update it is 0.

    Args:
        num_thresholds: how many thresholds the curve is evaluated at (more than 1):
            evenly spaced over [0, 1], the end ones just outside it. Ignored when
            `thresholds` is given.
        curve: "ROC" or "PR".
        name: the name the metric is logged and registered under.
        summation_method: how the area of each interval is taken: "interpolation"
            (trapezoids; for "PR", the interpolation of Davis & Goadrich 2006, see
            `interpolate_pr_auc`), "minoring" (the lower of its two ends: a lower bound of
            the area) or "majoring" (the higher: an upper bound).
        thresholds: the thresholds to use instead of `num_thresholds` evenly spaced ones
            (values in [0, 1]); the ones just outside [0, 1] are added to them.
    """

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", name=None,
                 summation_method: str = "interpolation", thresholds=None):
        if curve not in _CURVES:
            raise ValueError(f"Curve must be either ROC or PR. Curve {curve} is unknown.")
        if summation_method not in _SUMMATION_METHODS:
            raise ValueError(f"Invalid AUC summation method value: '{summation_method}'. "
                             f"Expected values are {_SUMMATION_METHODS}")
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            if any(not 0.0 <= t <= 1.0 for t in inner):
                raise ValueError(f"thresholds must be in [0, 1], got {list(thresholds)}")
            num_thresholds = len(inner) + 2
        else:
            if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) \
                    or num_thresholds <= 1:
                raise ValueError(f"num_thresholds must be > 1. Got {num_thresholds}")
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.num_thresholds = num_thresholds
        self.curve = curve
        self.summation_method = summation_method
        self.thresholds = [0.0 - _EPSILON] + inner + [1.0 + _EPSILON]
        super().__init__(name)

    def reset(self):
        for name in ("true_positives", "false_positives", "true_negatives",
                     "false_negatives"):
            self.register_state(name, torch.zeros(self.num_thresholds))

    def update(self, labels, predictions, weights=None):
        """Fold one batch in. Outside a traced step, scores outside [0, 1] raise a
        ValueError; inside one the values cannot be read, and such a score counts as
        below (under 0) or above (over 1) every threshold."""
        check_same_shape(labels, predictions, "AUCMetric")
        if not in_traced_step() and predictions.numel() and \
                bool(((predictions < 0) | (predictions > 1)).any()):
            raise ValueError("Values in `predictions` tensor must be in [0, 1]")
        t = self.num_thresholds
        w = weights_like(weights, predictions).reshape(-1)
        positive = labels.reshape(-1) != 0
        pos_w = torch.where(positive, w, torch.zeros_like(w))
        neg_w = w - pos_w
        thresholds = torch.tensor(self.thresholds, dtype=torch.float32)
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

    def interpolate_pr_auc(self):
        """The area under the precision-recall curve by the interpolation of Davis &
        Goadrich (2006): between two thresholds precision is taken as the true positives
        over the predicted positives along the straight line the counts move on, which is
        integrated exactly, rather than the trapezoid between the two precisions (which
        overestimates the area)."""
        tp, fp, fn = self.true_positives, self.false_positives, self.false_negatives
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = _div_no_nan(dtp, torch.clamp(dp, min=0))
        intercept = tp[1:] - slope * p[1:]
        both = (p[:-1] > 0) & (p[1:] > 0)
        ratio = torch.where(both, _div_no_nan(p[:-1], torch.clamp(p[1:], min=0)),
                            torch.ones_like(p[1:]))
        increment = _div_no_nan(slope * (dtp + intercept * torch.log(ratio)),
                                torch.clamp(tp[1:] + fn[1:], min=0))
        return increment.sum()

    def _value(self) -> torch.Tensor:
        if self.curve == "PR" and self.summation_method == "interpolation":
            return self.interpolate_pr_auc()
        tp, fp = self.true_positives, self.false_positives
        tn, fn = self.true_negatives, self.false_negatives
        recall = _div_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _div_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, _div_no_nan(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2
        elif self.summation_method == "minoring":
            heights = torch.minimum(y[:-1], y[1:])
        else:
            heights = torch.maximum(y[:-1], y[1:])
        return ((x[:-1] - x[1:]) * heights).sum()

    def compute(self) -> float:
        """The area, as a Python float (inside a traced step, a tensor of the step)."""
        value = self._value()
        return value if in_traced_step() else float(value)
