"""`cstorch.optim.Lion`: sign momentum (Chen et al., "Symbolic Discovery of Optimization
Algorithms", 2023)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Lion(U.ElementwiseOptimizer):
    """Lion: step by ``lr * sign(beta1 * m + (1 - beta1) * g)`` after decoupled weight decay
    ``p *= 1 - lr * weight_decay``, then ``m = beta2 * m + (1 - beta2) * g``."""

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float = 0.0001, betas=(0.9, 0.99), weight_decay=0.0):
        U.check("learning rate", lr)
        U.check("beta parameter at index 0", betas[0], high=1.0)
        U.check("beta parameter at index 1", betas[1], high=1.0)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def init_state(self, p, group):
        return {"exp_avg": torch.zeros_like(p)}

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        U.decay_weights(p, group["lr"], group["weight_decay"])
        direction = (state["exp_avg"] * beta1 + grad * U.one_minus(beta1)).sign()
        U.subtract_scaled(p, direction, group["lr"])
        U.ema_(state["exp_avg"], grad, beta2)
