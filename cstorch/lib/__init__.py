"""`cerebras.pytorch.lib`: the compiler bindings' Python surface (`cerebras_pytorch_lib`)."""
from cstorch.lib import cerebras_pytorch_lib

__all__ = ["cerebras_pytorch_lib"]
