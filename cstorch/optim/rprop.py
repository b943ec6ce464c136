"""`cstorch.optim.Rprop`: resilient backpropagation (Riedmiller & Braun)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Rprop(U.ElementwiseOptimizer):
    """Rprop: each coordinate's ``step_size`` (starting at ``lr``) grows by ``etas[1]`` while
    the gradient keeps its sign and shrinks by ``etas[0]`` when it flips, within
    ``step_sizes``; after a flip that coordinate skips one update. ``prev`` is the last
    gradient used."""

    def __init__(self, params: ParamsT, lr: float = 0.001, etas=(0.5, 1.2),
                 step_sizes=(1e-06, 50.0)):
        U.check("learning rate", lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, dict(lr=lr, etas=etas, step_sizes=step_sizes))

    def init_state(self, p, group):
        lr = group["lr"]
        return {"prev": torch.zeros_like(p),
                "step_size": torch.zeros_like(p).add_(lr)}

    def update(self, p, grad, group, state):
        eta_minus, eta_plus = group["etas"]
        low, high = group["step_sizes"]
        agreement = (grad * state["prev"]).sign()
        factor = torch.where(agreement > 0, U.full_like(grad, eta_plus),
                             torch.where(agreement < 0, U.full_like(grad, eta_minus),
                                         torch.ones_like(grad)))
        step_size = state["step_size"].mul_(factor)
        step_size.copy_(U.clamp(step_size, low, high))
        grad = torch.where(agreement < 0, torch.zeros_like(grad), grad)
        p.addcmul_(grad.sign(), state["step_size"], value=-1)
        state["prev"].copy_(grad)
