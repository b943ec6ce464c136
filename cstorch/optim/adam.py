"""`cstorch.optim.Adam` and the update it shares with AdamW."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class AdamBase(U.ElementwiseOptimizer):
    """Adam's moment estimates with two kinds of weight decay.

    ``l2_regularization_rate`` adds ``rate * p`` to the gradient (classic Adam);
    ``weight_decay`` shrinks the parameter by ``1 - lr * weight_decay`` before the Adam
    update (AdamW). With ``correct_bias`` each
    parameter keeps the running powers ``beta1_power``/``beta2_power`` (tensors, so a traced
    step advances them) and the step size is ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``.
    """

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.0, l2_regularization_rate=0.0, correct_bias=True, amsgrad=False):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check_betas(betas)
        U.check("weight_decay value", weight_decay)
        U.check("l2_regularization_rate value", l2_regularization_rate)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        l2_regularization_rate=l2_regularization_rate, correct_bias=correct_bias,
                        amsgrad=amsgrad)
        super().__init__(params, defaults)

    def init_state(self, p, group):
        state = {}
        if group["correct_bias"]:
            state["beta1_power"] = torch.tensor(1.0)
            state["beta2_power"] = torch.tensor(1.0)
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p)
        return state

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        grad = U.l2_regularize(grad, p, group["l2_regularization_rate"])
        U.ema_(state["exp_avg"], grad, beta1)
        U.ema_sq_(state["exp_avg_sq"], grad, beta2)
        second = state["exp_avg_sq"]
        if group["amsgrad"]:
            torch.maximum(state["max_exp_avg_sq"], second, out=state["max_exp_avg_sq"])
            second = state["max_exp_avg_sq"]
        denom = second.sqrt().add_(group["eps"])
        step_size = lr
        if group["correct_bias"]:
            state["beta1_power"].mul_(beta1)
            state["beta2_power"].mul_(beta2)
            step_size = U.scale(torch.sqrt(1 - state["beta2_power"]) / (1 - state["beta1_power"]), lr)
        U.decay_weights(p, lr, group["weight_decay"])
        U.subtract_scaled(p, state["exp_avg"] / denom, step_size)


class Adam(AdamBase):
    """Adam (Kingma & Ba) with L2 regularisation as ``weight_decay`` and optional AMSGrad.

    Defaults follow the real package (``eps=1e-6``); the state holds ``beta1_power``,
    ``beta2_power``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad).
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.0, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                         l2_regularization_rate=weight_decay, correct_bias=True, amsgrad=amsgrad)
