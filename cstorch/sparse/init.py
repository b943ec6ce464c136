"""How a sparsity mask starts: ``init_method`` of the sparsity algorithms.

An init method is called once per parameter, eagerly, when the algorithm is applied to the
module: ``init_method(p, sparsity) -> mask``, `p` the parameter's value and `sparsity` the
level at step 0 (a float), the mask a bool tensor of `p`'s shape, True where the weight
stays. The built-in methods keep exactly ``floor((1 - sparsity) * numel)`` weights
(``"from_zeros"`` keeps the nonzero ones, whatever the level):

- ``"random"``: weights chosen uniformly at random (torch's default generator, so
  ``torch.manual_seed`` makes it repeatable);
- ``"topk"``: the weights of largest magnitude;
- ``"from_zeros"``: the weights that are not zero now (a model sparsified before);
- ``"checkerboard"``: weights spread evenly over the flattened parameter.
"""
import torch

from cstorch.sparse.utils import keep_count, top_ranked


def random(p: torch.Tensor, sparsity: float) -> torch.Tensor:
    return top_ranked(torch.rand(tuple(p.shape)), keep_count(p.numel(), sparsity))


def topk(p: torch.Tensor, sparsity: float) -> torch.Tensor:
    return top_ranked(p.detach().abs().float(), keep_count(p.numel(), sparsity))


def from_zeros(p: torch.Tensor, sparsity: float) -> torch.Tensor:
    return p.detach() != 0


def checkerboard(p: torch.Tensor, sparsity: float) -> torch.Tensor:
    n = p.numel()
    k = int(keep_count(n, sparsity))
    i = torch.arange(n, dtype=torch.int64)
    # Element i is kept when the running count of kept elements, i * k / n, passes an
    # integer at it: exactly k elements, evenly spaced.
    return ((i + 1) * k // n > i * k // n).reshape(tuple(p.shape))


INIT_METHODS = {"random": random, "topk": topk, "from_zeros": from_zeros,
                "checkerboard": checkerboard}


def make_init_method(init_method):
    """The init method a name ("random", "topk", "from_zeros", "checkerboard") or a
    callable ``(p, sparsity) -> mask`` stands for."""
    if callable(init_method):
        return init_method
    if isinstance(init_method, str) and init_method in INIT_METHODS:
        return INIT_METHODS[init_method]
    raise ValueError(f"unknown sparsity init_method {init_method!r}: use one of "
                     f"{sorted(INIT_METHODS)} or a callable (p, sparsity) -> bool mask")


def initial_mask(init_method, p: torch.Tensor, sparsity: float, name: str) -> torch.Tensor:
    """Run `init_method` for parameter `name` and check what it returns."""
    with torch.no_grad():
        mask = init_method(p.detach(), sparsity)
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(p.shape):
        shape = getattr(mask, "shape", None)
        raise ValueError(f"the sparsity init_method returned {type(mask).__name__} of shape "
                         f"{shape} for {name!r}; it must return a mask of the parameter's "
                         f"shape {tuple(p.shape)}")
    return torch.as_tensor(mask).detach().to(torch.bool).clone()
