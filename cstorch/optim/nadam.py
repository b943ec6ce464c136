"""`cstorch.optim.NAdam`: Adam with Nesterov momentum (Dozat, 2016)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class NAdam(U.ElementwiseOptimizer):
    """NAdam with the momentum schedule ``mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay))``.

    Per parameter the state holds ``step`` and the running product ``mu_product`` as tensors.
    ``weight_decay`` is L2 regularisation of the gradient. The momentum term is divided by
    ``1 - mu_product * mu_next**2`` (where torch uses ``1 - mu_product * mu_next``), which is
    what the real package's recorded trajectories follow.
    """

    def __init__(self, params: ParamsT, lr: float = 0.002, betas=(0.9, 0.999), eps=1e-08,
                 weight_decay=0, momentum_decay=0.004):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check_betas(betas)
        U.check("weight_decay value", weight_decay)
        U.check("momentum_decay value", momentum_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay))

    def init_state(self, p, group):
        return {"mu_product": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p), "step": U.counter()}

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        lr, decay = group["lr"], group["momentum_decay"]
        step = state["step"].add_(1)
        mu = beta1 * (1 - 0.5 * torch.pow(0.96, step * decay))
        mu_next = beta1 * (1 - 0.5 * torch.pow(0.96, (step + 1) * decay))
        mu_product = state["mu_product"].mul_(mu)
        U.ema_(state["exp_avg"], grad, beta1)
        # a float32 complement, as the real package's recorded second moment shows
        U.ema_sq_(state["exp_avg_sq"], grad, beta2, U.one_minus_f32)
        denom = (state["exp_avg_sq"] / (1 - torch.pow(beta2, step))).sqrt() + group["eps"]
        U.subtract_scaled(p, grad / denom, U.scale((1 - mu) / (1 - mu_product), lr))
        U.subtract_scaled(p, state["exp_avg"] / denom,
                          U.scale(mu_next / (1 - mu_product * mu_next * mu_next), lr))
