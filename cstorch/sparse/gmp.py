"""`GMP`: gradual magnitude pruning."""
import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import Constant, keep_count, top_ranked


class GMP(DynamicSparsityAlgorithm):
    """Gradual magnitude pruning (Zhu and Gupta, 2017): on each update step keep the
    weights of largest magnitude among those still kept, as many as the scheduled
    ``sparsity`` level leaves. The level must change over the steps (``{"type":
    "linear", "init": 0.0, "slope": ...}``, ``{"type": "exp", ...}``, ...; a constant
    level is refused: use `Static`); pruned weights are not brought back while it grows.
    Equal magnitudes are taken in element order. Takes the arguments of
    `DynamicSparsityAlgorithm` (``sparsity``, ``update``, ``init_method``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if isinstance(self.sparsity, Constant):
            raise ValueError(
                f"Configured with constant sparsity {self.sparsity.value}. This is not valid, "
                "because the sparsity pattern would not change during training. For a static "
                "sparsity pattern, use `algorithm=\"static\".`")

    def update_mask(self, p, mask, sparsity):
        score = torch.where(mask, p.abs().to(torch.float32), torch.full_like(p, -1.0,
                                                                            dtype=torch.float32))
        return top_ranked(score, keep_count(p.numel(), sparsity))
