"""Evaluation metrics whose running totals live in the run's state on the device.

Create them as attributes of a model (or anywhere), call them with each batch inside a
traced eval step, and read `float(metric)` after the loop; see `Metric`.
"""
from cstorch.metrics.accuracy import AccuracyMetric
from cstorch.metrics.auc import AUCMetric
from cstorch.metrics.confusion import (DiceCoefficientMetric, FBetaScoreMetric, MeanIOUMetric,
                                       MeanPerClassAccuracyMetric)
from cstorch.metrics.mean import MeanMetric
from cstorch.metrics.metric import Metric, get_all_metrics
from cstorch.metrics.perplexity import PerplexityMetric
from cstorch.metrics.top_k import PrecisionAtKMetric, RecallAtKMetric

__all__ = [
    "Metric", "AccuracyMetric", "PerplexityMetric", "MeanMetric", "FBetaScoreMetric",
    "MeanIOUMetric", "DiceCoefficientMetric", "MeanPerClassAccuracyMetric",
    "PrecisionAtKMetric", "RecallAtKMetric", "AUCMetric", "get_all_metrics",
]
