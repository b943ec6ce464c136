"""`RigL`: rigged lottery."""
import torch

from cstorch.sparse.set import SET


class RigL(SET):
    """RigL (Evci et al., 2020): as `SET`, but the connections regrown are the pruned ones
    with the largest gradient magnitude, the gradient being the dense one of this step
    (before the mask was applied to it). ``drop_fraction`` and ``update`` as for `SET`.
    A connection dropped this step may be regrown (it keeps its weight).

    ``balance_in_groups`` / ``balance_out_groups`` (balancing the regrowth over groups of
    rows or columns) are not supported and must be left None.
    """

    wants_dense_grads = True

    def __init__(self, drop_fraction=0.3, balance_in_groups=None, balance_out_groups=None,
                 **kwargs):
        if balance_in_groups is not None or balance_out_groups is not None:
            raise ValueError("RigL's balance_in_groups and balance_out_groups are not supported "
                             "by this implementation; leave them None")
        super().__init__(drop_fraction=drop_fraction, **kwargs)

    def regrow_score(self, p, mask, name):
        return self.dense_grad(p).abs().to(torch.float32)
