"""`cstorch.optim.Adamax`: Adam with an infinity-norm second moment."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Adamax(U.ElementwiseOptimizer):
    """Adamax (Kingma & Ba, section 7). ``weight_decay`` is L2 regularisation of the gradient.

    The bias correction of the first moment uses the running power ``beta1_power``, kept as a
    per-parameter tensor so a traced step advances it.
    """

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
                 weight_decay=0.0, maximize=False):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check_betas(betas)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def init_state(self, p, group):
        return {"exp_avg": torch.zeros_like(p), "exp_inf": torch.zeros_like(p),
                # beta1^t of the coming step t, advanced after it (the real package's values)
                "beta1_power": torch.as_tensor(group["betas"][0], dtype=torch.float32).clone()}

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        U.ema_(state["exp_avg"], grad, beta1)
        torch.maximum(state["exp_inf"] * beta2, grad.abs() + group["eps"], out=state["exp_inf"])
        step_size = U.scale(1 / (1 - state["beta1_power"]), group["lr"])
        U.subtract_scaled(p, state["exp_avg"] / state["exp_inf"], step_size)
        state["beta1_power"].mul_(beta1)
