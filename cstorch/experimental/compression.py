"""`cerebras.pytorch.experimental.Compression`: weight compression on a Cerebras system."""

import torch

from cstorch.utils.utils import FilterCallable, make_param_filter

__all__ = ["Compression"]

_ATTR = "_cstorch_compression"


class Compression:
    """Ask for the parameters `param_filter` selects (a glob pattern, a list of them or
    a callable ``(name, param) -> bool``) to be kept in compression format `format`.

    Applied like a module function: ``model.apply(Compression("format", "*.weight"))``.
    On a Cerebras system the weights are then stored and streamed in that format. Here
    weights stay in their own dtype on the devices, so this only records the request:
    `compressed` maps each selected parameter's name (its path from the module `apply`
    is called on) to the format, and `Compression.format_of(param)` reads it back from a
    parameter. What a step computes is unchanged.
    """

    def __init__(self, format: str, param_filter: str | list[str] | FilterCallable):
        if not isinstance(format, str) or not format:
            raise ValueError(f"Compression expects a format name, got {format!r}")
        self.format = format
        self.param_filter = make_param_filter(param_filter)
        self.compressed: dict[str, str] = {}

    def __call__(self, module: torch.nn.Module) -> None:
        # `Module.apply` calls the root last: its call sees every parameter's full name.
        for name, param in module.named_parameters():
            self.compressed = {n: f for n, f in self.compressed.items()
                               if not (n == name or name.endswith("." + n))}
            if self.param_filter(name, param):
                self.compressed[name] = self.format
                setattr(param, _ATTR, self.format)
            elif getattr(param, _ATTR, None) == self.format:   # from a submodule's call
                delattr(param, _ATTR)

    def apply(self, module: torch.nn.Module) -> torch.nn.Module:
        """Record the request on `module`'s parameters (`module.apply(self)`); returns
        `module`."""
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"Compression.apply expects a torch.nn.Module, got "
                            f"{type(module).__name__}")
        return module.apply(self)

    def annotate(self, tensor: torch.Tensor) -> torch.Tensor:
        """Record this format on `tensor` itself (whatever the filter says, as the caller
        picked it); returns `tensor`."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Compression.annotate expects a tensor, got {type(tensor).__name__}")
        setattr(tensor, _ATTR, self.format)
        return tensor

    @staticmethod
    def format_of(param: torch.Tensor):
        """The compression format recorded for `param`, or None."""
        return getattr(param, _ATTR, None)

    def __repr__(self):
        return f"Compression({self.format!r}, compressed={sorted(self.compressed)})"
