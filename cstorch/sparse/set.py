"""`SET`: sparse evolutionary training."""
import torch

from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.utils import (hash_uniform, keep_count, make_hyperparameter_schedule,
                                  name_seed, top_ranked)


class SET(DynamicSparsityAlgorithm):
    """Sparse evolutionary training (Mocanu et al., 2018): on each update step drop the
    ``drop_fraction`` of the kept weights with the smallest magnitude and regrow as many
    connections at random among the pruned ones, so the sparsity level holds.

    ``drop_fraction`` is a number or a schedule (``{"type": "cosine", "init": 0.3,
    "half_period": ...}`` anneals it). Of the k weights the level keeps, ``floor((1 -
    drop_fraction) * k)`` stay (14 of 44 are dropped at 0.3, as in the reference); as many
    as were dropped are regrown among the connections not kept (a connection dropped this
    step may be regrown, and keeps its weight).
    Regrown connections that were pruned start at zero. The random choice is a hash of
    (parameter name, step, element), so eager and traced runs regrow alike.
    """

    def __init__(self, drop_fraction=0.3, **kwargs):
        self.drop_fraction = make_hyperparameter_schedule(drop_fraction, "drop_fraction")
        if isinstance(drop_fraction, (int, float)) and not 0 <= drop_fraction <= 1:
            raise ValueError(f"{type(self).__name__}'s drop_fraction must be in [0, 1], "
                             f"got {drop_fraction}")
        super().__init__(**kwargs)

    def regrow_score(self, p, mask, name):
        """The score of each connection for regrowth (higher regrows first), >= 0."""
        return hash_uniform(tuple(p.shape), name_seed(name or ""), self.step)

    def drop_score(self, p, mask):
        """The score of each kept connection for keeping (lower drops first): the
        weight's magnitude after this step."""
        return p.abs()

    def update_mask(self, p, mask, sparsity):
        k = keep_count(p.numel(), sparsity)
        fraction = torch.clamp(self.drop_fraction(self.step), 0.0, 1.0)
        n_drop = k - keep_count(k, fraction)
        magnitude = self.drop_score(p, mask).to(torch.float32)
        kept = top_ranked(torch.where(mask, magnitude, torch.full_like(magnitude, -1.0)),
                          k - n_drop)
        score = self.regrow_score(p, mask, self.current_param_name).to(torch.float32)
        grown = top_ranked(torch.where(kept, torch.full_like(magnitude, -1.0), score), n_drop)
        return kept | grown
