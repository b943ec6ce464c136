"""`cstorch.optim.SGD`: stochastic gradient descent with optional momentum."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class SGD(U.ElementwiseOptimizer):
    """SGD with momentum, dampening, weight decay, Nesterov momentum and maximisation.

    As in the real package, the momentum buffer starts at zero before the first step, so
    with dampening the first step moves by ``(1 - dampening) * grad``.
    """

    def __init__(self, params: ParamsT, lr: float, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, maximize=False):
        U.check("learning rate", lr)
        U.check("momentum value", momentum)
        U.check("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def init_state(self, p, group):
        return {"momentum_buffer": torch.zeros_like(p)} if U.is_set(group["momentum"]) else {}

    def update_group(self, params, grads, group, states):
        momentum = group["momentum"]
        if U.is_set(momentum):
            bufs = [state["momentum_buffer"] for state in states]
            torch._foreach_mul_(bufs, momentum)
            U.add_scaled_all_(bufs, grads, U.one_minus(group["dampening"]))
            grads = U.add_scaled_all(grads, bufs, momentum) if group["nesterov"] else bufs
        U.subtract_scaled_all(params, grads, group["lr"])
