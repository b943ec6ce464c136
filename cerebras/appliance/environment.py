"""`appliance_environ`: environment variables for the processes that run a model.

On a Cerebras system these variables are shipped to the appliance's worker processes.
Here the model, the input pipeline and its dataloader workers run in this process and
its children, so setting a variable sets it in `os.environ` at once (children started
later inherit it). The mapping itself holds only what was set through it, so it lists
what a run asked for without the rest of the environment.
"""
import os
from collections.abc import MutableMapping


class ApplianceEnviron(MutableMapping):
    """A mapping of variable name to value whose writes also go to `os.environ`."""

    def __init__(self):
        self._vars = {}

    def __getitem__(self, key):
        return self._vars[key]

    def __setitem__(self, key, value):
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"environment variables are str -> str; got "
                            f"{type(key).__name__} -> {type(value).__name__} for {key!r}; "
                            f"convert the value with str() first")
        os.environ[key] = value
        self._vars[key] = value

    def __delitem__(self, key):
        del self._vars[key]
        os.environ.pop(key, None)

    def __iter__(self):
        return iter(self._vars)

    def __len__(self):
        return len(self._vars)

    def __repr__(self):
        return f"appliance_environ({self._vars!r})"


appliance_environ = ApplianceEnviron()

__all__ = ["ApplianceEnviron", "appliance_environ"]
