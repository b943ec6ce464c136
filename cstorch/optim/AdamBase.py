"""`cstorch.optim.AdamBase.AdamBase`: the update Adam and AdamW share.

As in the real package, `cstorch.optim.AdamBase` is this module and the class lives in it.
"""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class AdamBase(U.ElementwiseOptimizer):
    """Adam's moment estimates with two kinds of weight decay.

    ``l2_regularization_rate`` adds ``rate * p`` to the gradient (classic Adam);
    ``weight_decay`` shrinks the parameter by ``1 - lr * weight_decay`` before the Adam
    update (AdamW). With ``correct_bias`` each
    parameter keeps the running powers ``beta1_power``/``beta2_power`` (tensors, so a traced
    step advances them): ``beta^t`` for the coming step t, so ``beta`` before the first,
    and the step size is ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``.
    """

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
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
        state = {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p)
        if group["correct_bias"]:
            # beta^t of the coming step t, advanced after it (the real package's values)
            beta1, beta2 = group["betas"]
            state["beta1_power"] = torch.as_tensor(beta1, dtype=torch.float32).clone()
            state["beta2_power"] = torch.as_tensor(beta2, dtype=torch.float32).clone()
        return state

    def update_group(self, params, grads, group, states):
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        grads = U.l2_regularize_all(grads, params, group["l2_regularization_rate"])
        exp_avgs = [state["exp_avg"] for state in states]
        U.ema_all_(exp_avgs, grads, beta1)
        second = [state["exp_avg_sq"] for state in states]
        U.ema_sq_all_(second, grads, beta2)
        if group["amsgrad"]:
            highest = [state["max_exp_avg_sq"] for state in states]
            torch._foreach_maximum_(highest, second)
            second = highest
        denom = torch._foreach_sqrt(second)
        U.add_all_(denom, group["eps"])
        step_size = lr
        if group["correct_bias"]:
            beta1_powers = [state["beta1_power"] for state in states]
            beta2_powers = [state["beta2_power"] for state in states]
            # lr * sqrt(1 - beta2^t) / (1 - beta1^t), one 0-d tensor per parameter
            step_size = torch._foreach_sqrt(U.one_minus_all(beta2_powers))
            torch._foreach_div_(step_size, U.one_minus_all(beta1_powers))
            torch._foreach_mul_(step_size, lr)
            torch._foreach_mul_(beta1_powers, beta1)
            torch._foreach_mul_(beta2_powers, beta2)
        U.decay_weights_all(params, lr, group["weight_decay"])
        U.subtract_scaled_all(params, torch._foreach_div(exp_avgs, denom), step_size, scratch=True)

    def load_state_dict(self, state_dict):
        """Load a state dict this optimizer's class saved (see `Optimizer.load_state_dict`)."""
        super().load_state_dict(state_dict)
