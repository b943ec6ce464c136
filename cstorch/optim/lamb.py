"""`cstorch.optim.Lamb`: layer-wise adaptive moments for large batches (You et al., 2019)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Lamb(U.ElementwiseOptimizer):
    """LAMB: an Adam step (without bias correction) plus decoupled ``weight_decay * p``,
    scaled per parameter by the trust ratio ``min(|p|, 10) / |step|`` (1 where either norm
    is zero). ``adam=True`` fixes the trust ratio at 1, giving plain Adam with weight decay.
    """

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
                 weight_decay=0, adam=False):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check_betas(betas)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      adam=adam))

    def init_state(self, p, group):
        return {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        U.ema_(state["exp_avg"], grad, beta1)
        U.ema_sq_(state["exp_avg_sq"], grad, beta2)
        adam_step = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])
        if U.is_set(group["weight_decay"]):
            adam_step = U.add_scaled(adam_step, p, group["weight_decay"])
        if group["adam"]:
            U.subtract_scaled(p, adam_step, group["lr"])
            return
        weight_norm = p.norm().clamp(0, 10)
        adam_norm = adam_step.norm()
        # Where-select instead of a Python branch: the norms are traced values.
        trust = torch.where((weight_norm > 0) & (adam_norm > 0), weight_norm / adam_norm,
                            torch.ones_like(weight_norm))
        U.subtract_scaled(p, adam_step * trust, group["lr"])
