"""`cstorch.optim.Adagrad`: per-coordinate learning rates from accumulated squared gradients."""

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


class Adagrad(U.ElementwiseOptimizer):
    """Adagrad (Duchi et al.) with learning-rate decay ``lr / (1 + (t - 1) * lr_decay)``.

    The accumulator ``sum`` starts at ``initial_accumulator_value``; ``step`` is a
    per-parameter tensor counter.
    """

    def __init__(self, params: ParamsT, lr: float = 0.01, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-06, maximize=False):
        U.check("learning rate", lr)
        U.check("lr_decay value", lr_decay)
        U.check("weight_decay value", weight_decay)
        U.check("initial_accumulator_value", initial_accumulator_value)
        U.check("epsilon value", eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize))

    def init_state(self, p, group):
        return {"sum": U.full_like(p, group["initial_accumulator_value"]),
                "step": U.counter()}

    def update(self, p, grad, group, state):
        state["step"].add_(1)
        clr = U.scale(1 / (1 + (state["step"] - 1) * group["lr_decay"]), group["lr"])
        state["sum"].addcmul_(grad, grad)
        U.subtract_scaled(p, grad / (state["sum"].sqrt() + group["eps"]), clr)
