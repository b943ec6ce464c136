"""`cerebras.pytorch.backends`: flags that control specific backends (only `csx` has any)."""
from cstorch.backends import csx

__all__ = ["csx"]
