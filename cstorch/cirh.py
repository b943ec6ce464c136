"""`cerebras.pytorch.cirh`: fused ops of the Cerebras IR, as plain torch functions.

On a Cerebras system these are single fused kernels used for sampling during generation.
Here each is a short composition of static-shape torch ops that computes the same
result, traceable into a compiled step. They are meant for inference under
`torch.no_grad()`.
"""
from typing import NamedTuple

import torch

__all__ = ["FusedTopK", "FusedTopP", "TopK"]


class TopK(NamedTuple):
    """What `FusedTopK` returns: the `k` largest `values` along the chosen dimension, in
    descending order, and their `indices` into it (int64)."""
    values: torch.Tensor
    indices: torch.Tensor


def FusedTopK(input: torch.Tensor, k: int, dimension: int = -1) -> TopK:
    """The `k` largest entries of `input` along `dimension` and where they are, sorted
    descending, fused into one value for `FusedTopP`: a `TopK` (values, indices), the
    same as ``torch.topk(input, k, dim=dimension)``."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"FusedTopK expects a positive int k, got {k!r}")
    if k > input.shape[dimension]:
        raise ValueError(f"FusedTopK: k={k} exceeds the {input.shape[dimension]} entries of "
                         f"dimension {dimension}")
    values, indices = torch.topk(input, k, dim=dimension, largest=True, sorted=True)
    return TopK(values, indices)


def FusedTopP(topk: TopK, p: torch.Tensor | float, u: torch.Tensor,
              k: torch.Tensor | int | None = None) -> torch.Tensor:
    """Sample one index per row from the output of `FusedTopK` (over its last dimension),
    by top-k then top-p (nucleus) filtering, with the caller's uniform random numbers.

    For each row, with the candidates' probabilities ``v`` in descending order:

    1. top-k: only the first `k` candidates are kept (`k` an int or a tensor with one
       value per row, broadcast as ``(rows, 1)``; None keeps all);
    2. top-p: of those, the smallest prefix whose probabilities add up to at least `p`
       is kept: a candidate is kept while the mass before it is below `p` (so the first
       candidate always is);
    3. the kept probabilities are renormalised, and the candidate whose cumulative
       probability first exceeds `u` (one uniform number in [0, 1) per row) is chosen.

    Returns the chosen entries' indices (from `topk.indices`), of shape ``u.shape`` (Model
    Zoo passes `p`, `u` and `k` as ``(batch, 1)``: the result is ``(batch, 1)``).
    """
    values, indices = topk
    if values.shape != indices.shape:
        raise ValueError("FusedTopP expects the (values, indices) FusedTopK returned")
    rows = values.shape[:-1]
    probs = values.to(torch.float32)
    p = _per_row(p, rows, torch.float32, probs.device)
    position = torch.arange(values.shape[-1], device=probs.device)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if k is not None:
        keep = keep & (position < _per_row(k, rows, torch.int64, probs.device))
    before = torch.cumsum(probs, dim=-1) - probs           # mass ahead of each candidate
    keep = keep & ((before < p) | (position == 0))
    kept = torch.where(keep, probs, 0.0)
    cumulative = torch.cumsum(kept, dim=-1)
    threshold = _per_row(u, rows, torch.float32, probs.device) * cumulative[..., -1:]
    # Candidates whose cumulative mass is at most the threshold come before the choice.
    chosen = (cumulative <= threshold).sum(dim=-1, keepdim=True)
    last_kept = keep.sum(dim=-1, keepdim=True) - 1
    chosen = torch.minimum(chosen, last_kept)
    shape = u.shape if isinstance(u, torch.Tensor) and u.numel() == chosen.numel() \
        else chosen.shape
    return torch.gather(indices, -1, chosen).reshape(shape)


def _per_row(x, rows: torch.Size, dtype: torch.dtype, device) -> torch.Tensor:
    """`x` (a number, or a tensor of one value or one value per row) as a column that
    broadcasts against ``rows + (width,)``."""
    x = torch.as_tensor(x, device=device)
    if x.numel() == 1:
        return x.reshape((1,) * (len(rows) + 1)).to(dtype)
    return x.reshape(tuple(rows) + (1,)).to(dtype)
