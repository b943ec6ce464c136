"""`Static`: a sparsity pattern fixed for the whole run."""
from cstorch.sparse.base import SparsityAlgorithm


class Static(SparsityAlgorithm):
    """Sparsify the chosen parameters once, at ``sparsity`` (a level in [0, 1)), with the
    pattern `init_method` makes, and keep that pattern: the masks never change, but they
    are applied to the parameters, gradients and optimizer state as for every algorithm
    (`cstorch.sparse.base`)."""

    def __init__(self, sparsity=None, **kwargs):
        if sparsity is None:
            raise ValueError("Static needs a sparsity level: Static(sparsity=0.5), a level in "
                             "[0, 1)")
        super().__init__(sparsity=sparsity, **kwargs)

    def update(self, optimizer):
        """Apply the masks to `optimizer`'s parameters and their optimizer state and
        advance the step counter (the pattern itself never changes)."""
        super().update(optimizer)

    def csx_annotate_sparsity(self, param):
        """Tell the wafer compiler the (fixed) sparsity of `param`; nothing to do here."""
