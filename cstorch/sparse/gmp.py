"""`GMP`: gradual magnitude pruning."""
import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import keep_count, top_ranked


class GMP(DynamicSparsityAlgorithm):
    """Gradual magnitude pruning (Zhu and Gupta, 2017): on each update step keep the
    weights of largest magnitude among those still kept, as many as the scheduled
    ``sparsity`` level leaves. The level is expected to grow (``{"type": "linear",
    "init": 0.0, "slope": ...}``, ``{"type": "exp", ...}``, ...): pruned weights are not
    brought back while it does. Equal magnitudes are taken in element order."""

    def update_mask(self, p, mask, sparsity, name=None):
        score = torch.where(mask, p.abs().to(torch.float32), torch.full_like(p, -1.0,
                                                                            dtype=torch.float32))
        return top_ranked(score, keep_count(p.numel(), sparsity))
