"""`cerebras.pytorch.nn.Scope`: a named region of a model's forward pass."""
import torch

__all__ = ["Scope"]


class Scope(torch.nn.Module):
    """Marks where a named region of the model begins (``x = scope(x)``) and ends
    (``x = scope.exit(x)``). On a Cerebras system the compiler groups the ops between the
    two under `scope_name`; here the values pass through both unchanged, so a model that
    uses scopes computes the same values.

    Args:
        scope_name: the region's name.
    """

    def __init__(self, scope_name):
        super().__init__()
        self.scope_name = scope_name

    def forward(self, input):
        """Enter the region: returns `input` unchanged."""
        return input

    def exit(self, input):
        """Leave the region: returns `input` unchanged."""
        return input

    def extra_repr(self):
        return f"scope_name={self.scope_name!r}"
