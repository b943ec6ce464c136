"""Losses that `cerebras.pytorch.nn` implements itself, as `torch.nn.Module`s.

Each computes what the `torch.nn` loss of the same name computes, written with
elementwise ops, reductions and selects only, so every backend lowers it the same way
and a traced step differentiates it like any other op. Each takes that loss's arguments
(positionally or by keyword) and `use_autogen` (kept as `autogen_enabled`; see
`cstorch.nn.autogen`).
"""
import functools
import inspect
import math

import torch
from torch.nn import _reduction

from cstorch.nn.autogen import take_use_autogen
from cstorch.run.capture_context import capturing

__all__ = ["GaussianNLLLoss", "HuberLoss", "MultiMarginLoss", "SmoothL1Loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _arguments(owner: str, spec, args, kwargs) -> dict:
    """`args`/`kwargs` bound to the parameters of `spec` (a function that only declares
    them), defaults filled in, with a TypeError naming `owner` for anything else."""
    try:
        bound = _signature(spec).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{owner}.__init__(): {e}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


@functools.cache
def _signature(spec) -> inspect.Signature:
    return inspect.signature(spec)


def _reduction_of(owner: str, size_average, reduce, reduction) -> str:
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{owner}: {reduction} is not a valid value for reduction; use "
                         "'mean', 'sum' or 'none'")
    return reduction


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _huber_parameters(reduction="mean", delta=1.0):
    pass


def _gaussian_nll_parameters(*, full=False, eps=1e-6, reduction="mean"):
    pass


def _multi_margin_parameters(p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                             reduction="mean"):
    pass


def _smooth_l1_parameters(size_average=None, reduce=None, reduction="mean", beta=1.0):
    pass


class HuberLoss(torch.nn.Module):
    """Huber loss, as `torch.nn.HuberLoss` defines it: for each element, with
    ``d = |input - target|``,

        0.5 * d**2                    where d < delta
        delta * (d - 0.5 * delta)     elsewhere

    then reduced by `reduction` ("mean", "sum" or "none").

    Args (positionally or by keyword): reduction="mean", delta=1.0; keyword
    use_autogen=False.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.autogen_enabled = take_use_autogen("HuberLoss", kwargs)
        a = _arguments("HuberLoss", _huber_parameters, args, kwargs)
        self.reduction = _reduction_of("HuberLoss", None, None, a["reduction"])
        if not a["delta"] > 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {a['delta']}")
        self.delta = a["delta"]

    def forward(self, *args, **kwargs):
        """forward(input, target): the loss of `input` against `target`."""
        input, target = _arguments("HuberLoss.forward", _input_target, args, kwargs).values()
        diff = torch.abs(input - target)
        loss = torch.where(diff < self.delta, 0.5 * diff * diff,
                           self.delta * (diff - 0.5 * self.delta))
        return _reduce(loss, self.reduction)


class GaussianNLLLoss(torch.nn.Module):
    """Gaussian negative log likelihood, as `torch.nn.GaussianNLLLoss` defines it: for
    `input` the expected values, `target` samples and `var` the variances,

        0.5 * (log(max(var, eps)) + (input - target)**2 / max(var, eps))

    plus ``0.5 * log(2 pi)`` when `full`, then reduced by `reduction`. `var` has the shape
    of `input`, or that shape with its last dimension 1 or missing (one variance for all
    of a sample's values). The clamp to `eps` passes gradients through unchanged, as
    PyTorch's does.

    Args (by keyword): full=False, eps=1e-6, reduction="mean", use_autogen=False.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.autogen_enabled = take_use_autogen("GaussianNLLLoss", kwargs)
        a = _arguments("GaussianNLLLoss", _gaussian_nll_parameters, args, kwargs)
        self.full = a["full"]
        self.eps = a["eps"]
        self.reduction = _reduction_of("GaussianNLLLoss", None, None, a["reduction"])

    def forward(self, *args, **kwargs):
        """forward(input, target, var): the loss of `target` under N(input, var)."""
        input, target, var = _arguments("GaussianNLLLoss.forward", _input_target_var, args,
                                        kwargs).values()
        if var.shape != input.shape:
            if input.shape[:-1] == var.shape:
                var = var.unsqueeze(-1)
            elif not (input.shape[:-1] == var.shape[:-1] and var.shape[-1] == 1):
                raise ValueError(f"GaussianNLLLoss: var of shape {tuple(var.shape)} does not "
                                 f"fit input of shape {tuple(input.shape)}")
        # Values of a step being traced cannot be read; only eager calls check them.
        if capturing.get() is None and bool((var < 0).any()):
            raise ValueError("GaussianNLLLoss: var has negative entries")
        # The clamped value with the gradient of the unclamped one.
        var = var + (torch.clamp(var, min=self.eps) - var).detach()
        loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
        if self.full:
            loss = loss + 0.5 * math.log(2 * math.pi)
        return _reduce(loss, self.reduction)


class MultiMarginLoss(torch.nn.Module):
    """Multi-class margin (hinge) loss, as `torch.nn.MultiMarginLoss` defines it: for
    each sample of scores `x` (classes last) with target class `y`,

        sum over classes i != y of weight[y] * max(0, margin - x[y] + x[i]) ** p

    divided by the number of classes, then averaged or summed over the samples
    (`reduction` "mean" or "sum"; "none" is refused, as the real package refuses it).

    Args (positionally or by keyword): p=1 (1 or 2), margin=1.0, weight=None (a weight
    per class), size_average=None, reduce=None (deprecated forms of `reduction`),
    reduction="mean"; keyword use_autogen=False.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.autogen_enabled = take_use_autogen("MultiMarginLoss", kwargs)
        a = _arguments("MultiMarginLoss", _multi_margin_parameters, args, kwargs)
        if a["p"] not in (1, 2):
            raise ValueError(f"MultiMarginLoss: only p == 1 and p == 2 are supported, got "
                             f"{a['p']}")
        if a["weight"] is not None and a["weight"].dim() != 1:
            raise ValueError("MultiMarginLoss: weight must be one value per class (1-D), "
                             f"got shape {tuple(a['weight'].shape)}")
        self.p = a["p"]
        self.margin = a["margin"]
        self.weight = a["weight"]
        self.reduction = _reduction_of("MultiMarginLoss", a["size_average"], a["reduce"],
                                       a["reduction"])
        # The real package refuses per-sample losses, with this error and wording.
        if self.reduction == "none":
            raise AssertionError("MultiMarginLoss does not support 'none' reduction.")

    def forward(self, *args, **kwargs):
        """forward(input, target): `input` scores of shape (N, C) or (C,), `target` class
        ids of shape (N,) or ()."""
        input, target = _arguments("MultiMarginLoss.forward", _input_target, args,
                                   kwargs).values()
        if input.dim() not in (1, 2) or target.dim() != input.dim() - 1:
            raise ValueError(f"MultiMarginLoss: expects input (N, C) with target (N,), or "
                             f"input (C,) with target (); got {tuple(input.shape)} and "
                             f"{tuple(target.shape)}")
        classes = input.shape[-1]
        target = target.long()
        is_target = target.unsqueeze(-1) == torch.arange(classes, device=input.device)
        picked = (input * is_target.to(input.dtype)).sum(-1, keepdim=True)
        margins = torch.clamp(self.margin - picked + input, min=0)
        if self.p == 2:
            margins = margins * margins
        if self.weight is not None:
            w = self.weight.to(input.dtype)
            margins = margins * (is_target.to(input.dtype) * w).sum(-1, keepdim=True)
        margins = torch.where(is_target, torch.zeros_like(margins), margins)
        return _reduce(margins.sum(-1) / classes, self.reduction)


class SmoothL1Loss(torch.nn.Module):
    """Smooth L1 loss, as `torch.nn.SmoothL1Loss` defines it: for each element, with
    ``d = |input - target|``,

        0.5 * d**2 / beta   where d < beta
        d - 0.5 * beta      elsewhere

    (plain L1 when `beta` is 0), then reduced by `reduction` ("mean", "sum" or "none").

    Args (positionally or by keyword): size_average=None, reduce=None (deprecated forms
    of `reduction`), reduction="mean", beta=1.0; keyword use_autogen=False.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.autogen_enabled = take_use_autogen("SmoothL1Loss", kwargs)
        a = _arguments("SmoothL1Loss", _smooth_l1_parameters, args, kwargs)
        self.reduction = _reduction_of("SmoothL1Loss", a["size_average"], a["reduce"],
                                       a["reduction"])
        if a["beta"] < 0:
            raise ValueError(f"SmoothL1Loss: beta must be non-negative, got {a['beta']}")
        self.beta = a["beta"]

    def forward(self, *args, **kwargs):
        """forward(input, target): the loss of `input` against `target`."""
        input, target = _arguments("SmoothL1Loss.forward", _input_target, args,
                                   kwargs).values()
        diff = torch.abs(input - target)
        if self.beta == 0.0:
            loss = diff
        else:
            loss = torch.where(diff < self.beta, 0.5 * diff * diff / self.beta,
                               diff - 0.5 * self.beta)
        return _reduce(loss, self.reduction)


def _input_target(input, target):
    pass


def _input_target_var(input, target, var):
    pass

