"""`cerebras.pytorch.storage.utils`: helpers of the checkpoint functions.

`renamed_keywords` lets a function take a parameter under a second name: the reference
document spells `cstorch.save(obj, checkpoint_file)` where the package names them
`save(state_dict, ckpt_path)`, and code written either way must run.
"""
import functools
import inspect


def renamed_keywords(**aliases):
    """Decorate a function so that each keyword `old=new` in `aliases` is accepted as
    another name of its parameter `new`. The signature shown stays the function's own;
    passing both names is a TypeError, as passing one parameter twice is."""
    def decorate(fn):
        params = inspect.signature(fn).parameters
        for new in aliases.values():
            if new not in params:
                raise ValueError(f"{fn.__qualname__} has no parameter {new!r}")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in aliases.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got both {new!r} and its other "
                                        f"name {old!r}")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return wrapper
    return decorate


__all__ = ["renamed_keywords"]
