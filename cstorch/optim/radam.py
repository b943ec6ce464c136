"""`cstorch.optim.RAdam`: Adam with a rectified adaptive learning rate (Liu et al., 2019)."""
import math
from fractions import Fraction

import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


def _expm1_minus_x(x):
    """``exp(x) - 1 - x`` without the cancellation of the direct form for small x."""
    series = torch.zeros_like(x)
    term = x * x / 2
    for k in range(3, 14):
        series = series + term
        term = term * x / k
    return torch.where(x < 0.5, series, torch.expm1(x) - x)


def _gregory(n):
    """The magnitudes ``|G_2|, ..., |G_n|`` of the Gregory coefficients, the Taylor
    coefficients of ``x / log(1 + x) = 1 + x/2 - x^2/12 + x^3/24 - ...`` (exact fractions
    from ``(x / log(1 + x)) * (log(1 + x) / x) = 1``)."""
    g = [Fraction(1)]
    for i in range(1, n + 1):
        g.append(-sum(Fraction((-1) ** m, m + 1) * g[i - m] for m in range(1, i + 1)))
    return [float(abs(c)) for c in g[2:]]


_GREGORY = _gregory(21)


def _rho_offset(e):
    """``K = 2 / e - 1 - 2 / c`` with ``e = 1 - beta2``, ``c = -log(beta2)``, for a tensor
    `e`, without the cancellation of the direct form (three terms near ``2 / e``).

    ``2 / c = (2 / e) * (-e / log(1 - e))``, and the series of Gregory coefficients gives
    ``K = 2 * sum_{n >= 2} |G_n| e^(n - 1)``: positive terms, so float32 Horner evaluation is
    accurate. Twenty terms are exact in float32 for ``e < 1/3``; for larger `e` (where
    ``rho_inf <= 5``, so no step is ever rectified) the truncation only lowers ``K``.
    """
    total = torch.zeros_like(e) + _GREGORY[-1]
    for coef in reversed(_GREGORY[:-1]):
        total = total * e + coef
    return 2 * e * total


def _rho(step, beta2):
    """RAdam's ``rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)`` and ``1 - beta2^t``.

    The direct form subtracts two numbers near ``rho_inf`` (about 2000 for beta2 = 0.999),
    losing most float32 digits just when rho_t crosses 5. With ``c = -log(beta2)`` and
    ``x = c t`` it equals ``K + (2 / c) (e^x - 1 - x) / (e^x - 1)``, where the constant
    ``K = 2 / (1 - beta2) - 1 - 2 / c`` is computed in Python doubles for a float `beta2`
    and by `_rho_offset` for a tensor one (a traced hyperparameter).
    """
    if isinstance(beta2, torch.Tensor):
        e = 1 - beta2  # exact in float32 for beta2 >= 0.5
        c = -torch.log1p(-e)
        k = _rho_offset(e)
    else:
        c = -math.log(beta2)
        k = 2 / (1 - beta2) - 1 - 2 / c
    x = step * c
    em1 = torch.expm1(x)
    return k + (2 / c) * _expm1_minus_x(x) / em1, -torch.expm1(-x)


class RAdam(U.ElementwiseOptimizer):
    """RAdam: while the variance estimate is unreliable (``rho_t <= 5``) the step is plain
    bias-corrected momentum; afterwards it is the rectified Adam step. The switch is a
    tensor select on the per-parameter ``step``, so a traced step handles both phases.
    ``weight_decay`` is L2 regularisation of the gradient.
    """

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
                 weight_decay=0.0):
        U.check("learning rate", lr)
        U.check("epsilon value", eps)
        U.check_betas(betas)
        U.check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def init_state(self, p, group):
        return {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
                "step": U.counter()}

    def update(self, p, grad, group, state):
        beta1, beta2 = group["betas"]
        step = state["step"].add_(1)
        # float32 complements, as the real package's recorded moments show
        U.ema_(state["exp_avg"], grad, beta1, U.one_minus_f32)
        U.ema_sq_(state["exp_avg_sq"], grad, beta2, U.one_minus_f32)
        bias1 = 1 - torch.pow(beta1, step)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t, bias2 = _rho(step, beta2)
        rectified = rho_t > 5
        safe_rho = torch.where(rectified, rho_t, torch.full_like(rho_t, 6.0))
        rect = torch.sqrt((safe_rho - 4) * (safe_rho - 2) * rho_inf
                          / ((rho_inf - 4) * (rho_inf - 2) * safe_rho))
        adaptive = bias2.sqrt() / (state["exp_avg_sq"].sqrt() + group["eps"])
        factor = torch.where(rectified, adaptive * rect, torch.ones_like(adaptive))
        U.subtract_scaled(p, state["exp_avg"] / bias1 * factor, group["lr"])
