"""`cstorch.optim.RMSprop`: scale steps by a running RMS of the gradient (Hinton)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class RMSprop(U.ElementwiseOptimizer):
    """RMSprop with optional momentum and centring (Graves, 2013).

    ``grad_avg`` exists only when ``centered`` and ``momentum_buffer`` only when
    ``momentum > 0``. ``weight_decay`` is L2 regularisation of the gradient.
    """

    def __init__(self, params: ParamsT, lr: float = 0.01, alpha=0.99, eps=1e-08, weight_decay=0,
                 momentum=0, centered=False):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check("momentum value", momentum)
        U.check("weight_decay value", weight_decay)
        U.check("alpha value", alpha)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay))

    def init_state(self, p, group):
        state = {"square_avg": torch.zeros_like(p)}
        if U.is_set(group["momentum"]):
            state["momentum_buffer"] = torch.zeros_like(p)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(p)
        return state

    def update(self, p, grad, group, state):
        alpha = group["alpha"]
        U.ema_sq_(state["square_avg"], grad, alpha)
        if group["centered"]:
            U.ema_(state["grad_avg"], grad, alpha)
            avg = state["square_avg"].addcmul(state["grad_avg"], state["grad_avg"], value=-1).sqrt()
        else:
            avg = state["square_avg"].sqrt()
        avg = avg + group["eps"]
        if U.is_set(group["momentum"]):
            buf = state["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, avg)
            U.subtract_scaled(p, buf, group["lr"])
        else:
            U.subtract_scaled(p, grad / avg, group["lr"])
