"""`cerebras.pytorch.utils.benchmark`: measure how fast a dataloader feeds a run."""
from cstorch.utils.benchmark import utils
from cstorch.utils.benchmark.utils.dataloader import benchmark_dataloader

__all__ = ["utils", "benchmark_dataloader"]
