"""`cstorch.optim.Adafactor`: memory-light adaptive steps (Shazeer & Stern, 2018)."""

import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT


def _rms(t):
    return t.norm(2) / (t.numel() ** 0.5)


class Adafactor(U.ElementwiseOptimizer):
    """Adafactor with factored second moments for parameters of two or more dimensions.

    Matrices keep a row and a column statistic (``exp_avg_sq_row``, ``exp_avg_sq_col``),
    other parameters a full ``exp_avg_sq``; ``exp_avg`` exists only with ``beta1``. The step
    size is ``lr``, or with ``relative_step`` ``min(1e-2, 1/sqrt(t))`` (``1e-6 * t`` with
    ``warmup_init``), times ``max(eps[1], rms(p))`` when ``scale_parameter``. Updates are
    clipped to RMS ``clip_threshold``; ``weight_decay`` is decoupled, scaled by the step size.
    """

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float | None, eps=(1e-30, 0.001),
                 clip_threshold=1.0, decay_rate=-0.8, beta1=None, weight_decay=0.0,
                 scale_parameter=True, relative_step=False, warmup_init=False):
        if lr is not None and relative_step:
            raise ValueError("Cannot combine manual lr and relative_step=True options")
        if warmup_init and not relative_step:
            raise ValueError("warmup_init=True requires relative_step=True")
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1, weight_decay=weight_decay,
                                      scale_parameter=scale_parameter, relative_step=relative_step,
                                      warmup_init=warmup_init))

    def init_state(self, p, group):
        state = {}
        if group["beta1"] is not None:
            state["exp_avg"] = torch.zeros_like(p)
        if p.dim() >= 2:
            state["exp_avg_sq_row"] = torch.zeros(p.shape[:-1], dtype=p.dtype)
            state["exp_avg_sq_col"] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=p.dtype)
        else:
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] = U.counter()
        return state

    def _step_size(self, p, group, step):
        if group["relative_step"]:
            floor = step * 1e-6 if group["warmup_init"] else torch.full_like(step, 1e-2)
            lr = torch.minimum(floor, torch.rsqrt(step))
        else:
            lr = group["lr"]
        if group["scale_parameter"]:
            lr = U.scale(U.clamp(_rms(p), low=group["eps"][1]), lr)
        return lr

    def update(self, p, grad, group, state):
        step = state["step"].add_(1)
        lr = self._step_size(p, group, step)
        beta2 = 1 - torch.pow(step, group["decay_rate"])
        update = grad * grad + group["eps"][0]
        if p.dim() >= 2:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2).add_(update.mean(dim=-1) * (1 - beta2))
            col.mul_(beta2).add_(update.mean(dim=-2) * (1 - beta2))
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = row_factor * col.unsqueeze(-2).rsqrt() * grad
        else:
            avg = state["exp_avg_sq"]
            avg.mul_(beta2).add_(update * (1 - beta2))
            update = avg.rsqrt() * grad
        update = update / torch.clamp(_rms(update) / group["clip_threshold"], min=1.0)
        update = U.scale(update, lr)
        if group["beta1"] is not None:
            U.ema_(state["exp_avg"], update, group["beta1"])
            update = state["exp_avg"]
        if U.is_set(group["weight_decay"]):
            p.sub_(U.scale(p, U.scale(lr, group["weight_decay"])))
        p.sub_(update)
