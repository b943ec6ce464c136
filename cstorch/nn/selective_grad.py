"""`cerebras.pytorch.nn.SelectiveGrad`: gradients for chosen elements of chosen weights."""
from collections.abc import Callable

import torch

from cstorch.utils.utils import FilterCallable, make_param_filter

__all__ = ["SelectiveGrad"]

InitMethod = str | Callable[[torch.Tensor], torch.Tensor]
_ATTR = "_cstorch_selective_grad"


def _mask_nonzero(param: torch.Tensor) -> torch.Tensor:
    return param != 0


def _mask_all(param: torch.Tensor) -> torch.Tensor:
    return torch.ones(param.shape, dtype=torch.bool)


_INIT_METHODS = {"nonzero": _mask_nonzero, "all": _mask_all}


class SelectiveGrad:
    """Let only some elements of some parameters receive gradients.

    ``model.apply(SelectiveGrad(param_filter, init_method))`` picks the parameters whose
    names `param_filter` selects (a glob pattern, a list of them, or a callable
    ``(name, param) -> bool``; None selects all) and makes for each a boolean mask with
    `init_method`:

    - ``"nonzero"`` (default): the elements that are non-zero when the mask is made, so
      elements at zero (pruned weights, say) get no gradient and keep their value under
      optimizers without weight decay;
    - ``"all"``: every element (gradients unchanged);
    - a callable ``param -> bool tensor`` of the parameter's shape.

    Forward values are unchanged; in the backward pass the gradient of a selected
    parameter is zero where its mask is false. The masks are fixed when `apply` runs
    (apply before `cstorch.compile`; a traced step holds them as constants of its
    program). Names are the parameters' paths from the module `apply` is called on.
    """

    def __init__(self, param_filter: str | list | FilterCallable | None = None,
                 init_method: InitMethod = "nonzero"):
        self.param_filter = make_param_filter(param_filter) if param_filter is not None \
            else (lambda name, param: True)
        if isinstance(init_method, str):
            if init_method not in _INIT_METHODS:
                raise ValueError(f"SelectiveGrad init_method must be one of "
                                 f"{sorted(_INIT_METHODS)} or a callable param -> mask, got "
                                 f"{init_method!r}")
            self.init_method = _INIT_METHODS[init_method]
        elif callable(init_method):
            self.init_method = init_method
        else:
            raise TypeError(f"SelectiveGrad init_method must be a string or a callable, got "
                            f"{type(init_method).__name__}")
        self.selected: dict[str, torch.Tensor] = {}   # parameter name -> mask

    def __call__(self, module: torch.nn.Module) -> None:
        # `Module.apply` calls submodules before their parents: each call looks at the
        # whole subtree, and the last call (the root's) decides with full names.
        for prefix, sub in module.named_modules():
            for pname, param in sub.named_parameters(recurse=False):
                full = f"{prefix}.{pname}" if prefix else pname
                stale = [n for n in self.selected if full.endswith("." + n) or n == full]
                for n in stale:
                    del self.selected[n]
                masks = _masks(sub)
                if self.param_filter(full, param):
                    masks[pname] = self._make_mask(full, param)
                    self.selected[full] = masks[pname]
                else:
                    masks.pop(pname, None)

    def _make_mask(self, name: str, param: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            value = param.host() if hasattr(param, "host") else param.detach()
            mask = self.init_method(value)
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(param.shape):
            raise ValueError(f"SelectiveGrad: the mask for {name} must be a tensor of shape "
                             f"{tuple(param.shape)}, got "
                             f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else mask!r}")
        return mask.detach().to(device="cpu", dtype=torch.bool).clone()

    def __repr__(self):
        return f"SelectiveGrad(selected={sorted(self.selected)})"


def _masks(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    masks = module.__dict__.get(_ATTR)
    if masks is None:
        masks = {}
        object.__setattr__(module, _ATTR, masks)
        module.register_forward_pre_hook(_before_forward)
        module.register_forward_hook(_after_forward, always_call=True)
    return masks


def _before_forward(module, args):
    if not torch.is_grad_enabled():
        return
    for name, mask in module.__dict__[_ATTR].items():
        param = module._parameters.get(name)
        if param is None or not param.requires_grad:
            continue
        # Same values; the gradient reaches `param` only where `mask` is true. Put in the
        # instance dict, the masked tensor is what `module.<name>` reads in forward.
        module.__dict__[name] = torch.where(mask.to(param.device), param, param.detach())


def _after_forward(module, args, output):
    for name in module.__dict__[_ATTR]:
        module.__dict__.pop(name, None)
