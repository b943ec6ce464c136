"""Update machinery the cstorch optimizers share.

Every rule here works on plain torch tensors with in-place ops, so one implementation
serves eager steps and traced ones: in a traced step the state tensors are the traced
stand-ins and their in-place updates become the step's new state. Hyperparameters may be
floats or tensors (a scheduler writes a tensor ``lr`` into each param group).
"""
from abc import abstractmethod

import torch

from cstorch.optim.optimizer import Optimizer


def counter() -> torch.Tensor:
    """A fresh step counter. A float32 tensor, so it can live in the traced state and be
    mixed into float arithmetic directly; it counts exactly up to 2**24 steps."""
    return torch.tensor(0.0)


def scale(x, factor):
    """``x * factor`` for a float or tensor `factor`."""
    return x * factor


def subtract_scaled(p, update, factor):
    """``p -= factor * update`` in place, `factor` a float or a tensor."""
    if isinstance(factor, torch.Tensor):
        p.sub_(update * factor)
    else:
        p.add_(update, alpha=-factor)


def decay_weights(p, lr, weight_decay):
    """Decoupled weight decay: ``p *= 1 - lr * weight_decay``."""
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)


def l2_regularize(grad, p, rate):
    """The gradient of an added ``rate / 2 * |p|^2`` term, folded into `grad`."""
    return grad.add(p, alpha=rate) if rate != 0 else grad


def ema_(avg, value, beta):
    """``avg = beta * avg + (1 - beta) * value`` in place."""
    avg.mul_(beta).add_(value, alpha=1 - beta)


def ema_sq_(avg, value, beta):
    """``avg = beta * avg + (1 - beta) * value**2`` in place."""
    avg.mul_(beta).addcmul_(value, value, value=1 - beta)


def check(name, value, low=0.0, high=None, strict_high=False):
    """Validate a hyperparameter the way torch's optimizers do."""
    if isinstance(value, torch.Tensor):
        return
    if value < low or (high is not None and (value >= high if strict_high else value > high)):
        raise ValueError(f"Invalid {name}: {value}")


def check_betas(betas):
    """Both Adam-style decay rates in [0, 1)."""
    for i, beta in enumerate(betas):
        check(f"beta parameter at index {i}", beta, high=1.0, strict_high=True)


class ElementwiseOptimizer(Optimizer):
    """An optimizer whose rule updates each parameter on its own.

    Subclasses give `init_state(p, group)` (the state of one parameter, created before
    the first step) and `update(p, grad, group, state)`. The loop here runs the closure,
    skips parameters without a gradient, and applies ``maximize`` and coupled ("L2")
    weight decay where the optimizer's param groups have them and
    `coupled_weight_decay` says so.
    """

    coupled_weight_decay = True

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.init_state(p, group)
                if state:  # no entry at all for stateless rules, as state_dict() shows
                    self.state[p].update(state)

    @abstractmethod
    def init_state(self, p, group) -> dict:
        """The state tensors of parameter `p`, keyed as in `state_dict()`."""

    @abstractmethod
    def update(self, p, grad, group, state):
        """Update `p` in place from `grad`, advancing `state` in place."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group.get("maximize", False):
                    grad = -grad
                if self.coupled_weight_decay:
                    grad = l2_regularize(grad, p, group.get("weight_decay", 0.0))
                self.update(p, grad, group, self.state[p])
        return loss
