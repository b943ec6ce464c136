"""`cerebras.pytorch.utils.benchmark.utils`: the benchmark implementations."""
from cstorch.utils.benchmark.utils import dataloader
from cstorch.utils.benchmark.utils.dataloader import (
    BatchMetrics,
    BatchSpec,
    BatchSpecOccurence,
    EpochMetrics,
    Metrics,
    benchmark_dataloader,
)

__all__ = [
    "dataloader",
    "benchmark_dataloader",
    "Metrics",
    "EpochMetrics",
    "BatchMetrics",
    "BatchSpec",
    "BatchSpecOccurence",
]
