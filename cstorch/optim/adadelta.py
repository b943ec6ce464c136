"""`cstorch.optim.Adadelta`: an adaptive learning-rate method (Zeiler, 2012)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Adadelta(U.ElementwiseOptimizer):
    """Adadelta; ``weight_decay`` is L2 regularisation of the gradient, ``lr`` scales the delta."""

    def __init__(self, params: ParamsT, lr: float = 1.0, rho=0.9, eps=1e-06, weight_decay=0,
                 maximize=False):
        U.check("learning rate", lr)
        U.check("rho value", rho, high=1.0)
        U.check("epsilon value", eps)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def init_state(self, p, group):
        return {"square_avg": torch.zeros_like(p), "acc_delta": torch.zeros_like(p)}

    def update(self, p, grad, group, state):
        rho, eps = group["rho"], group["eps"]
        U.ema_sq_(state["square_avg"], grad, rho)
        delta = (state["acc_delta"] + eps).sqrt() / (state["square_avg"] + eps).sqrt() * grad
        U.ema_sq_(state["acc_delta"], delta, rho)
        U.subtract_scaled(p, delta, group["lr"])
