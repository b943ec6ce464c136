"""`cstorch.optim.ASGD`: averaged stochastic gradient descent (Polyak & Juditsky)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class ASGD(U.ElementwiseOptimizer):
    """Averaged SGD. Each parameter keeps its step size ``eta``, averaging weight ``mu``,
    average ``ax`` and ``step`` as tensors; averaging starts after ``t0`` steps."""

    def __init__(self, params: ParamsT, lr: float = 0.01, lambd=0.0001, alpha=0.75,
                 t0=1000000.0, weight_decay=0, maximize=False):
        U.check("learning rate", lr)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                      weight_decay=weight_decay, maximize=maximize))

    def init_state(self, p, group):
        lr = group["lr"]
        return {"eta": torch.as_tensor(lr, dtype=torch.float32).clone(),
                "mu": torch.tensor(1.0), "ax": torch.zeros_like(p), "step": U.counter()}

    def update(self, p, grad, group, state):
        lambd, alpha = group["lambd"], group["alpha"]
        step, eta, mu = state["step"], state["eta"], state["mu"]
        step.add_(1)
        p.mul_(1 - lambd * eta)
        p.sub_(grad * eta)
        # mu is 1 until averaging starts, and then ax + (p - ax) * 1 is p itself.
        state["ax"].add_((p - state["ax"]) * mu)
        eta.copy_(U.scale(1 / (1 + U.scale(step, lambd * group["lr"])) ** alpha, group["lr"])
                  if not isinstance(group["lr"], torch.Tensor)
                  else group["lr"] / (1 + lambd * group["lr"] * step) ** alpha)
        mu.copy_(1 / torch.clamp(step - group["t0"], min=1.0))
