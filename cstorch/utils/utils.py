"""`cerebras.pytorch.utils.utils`: filters that pick parameters by name, and small
helpers for files and the environment."""
import contextlib
import fnmatch
import os
import re
from re import Pattern
from collections.abc import Callable

import torch

__all__ = ["FilterCallable", "convert_glob_to_regex", "make_param_filter", "get_dir_size",
           "override_env_vars"]

FilterCallable = Callable[[str, torch.Tensor], bool]
"""A parameter filter: ``(name, param) -> bool``, true for the parameters it selects."""


def convert_glob_to_regex(f: str | Pattern) -> Pattern:
    """The compiled regular expression of a glob pattern (``*`` any run of characters,
    ``?`` one character, ``[abc]`` one of a set, as `fnmatch` reads them), matching whole
    names: ``"*proj_[qkv]*.weight"`` matches ``"layers.0.proj_q_dense.weight"``. Use it
    with `search` or `match`; both see the whole name. A compiled pattern is returned
    as is."""
    if isinstance(f, re.Pattern):
        return f
    if not isinstance(f, str):
        raise TypeError(f"a glob pattern is a string, got {type(f).__name__}")
    return re.compile("^" + fnmatch.translate(f))


def make_param_filter(param_filter: str | list[str] | FilterCallable) -> FilterCallable:
    """A `FilterCallable` from a glob pattern, a list of them (a parameter is selected if
    any matches its name) or a filter callable (returned as is)."""
    if callable(param_filter) and not isinstance(param_filter, (str, re.Pattern)):
        return param_filter
    patterns = [param_filter] if isinstance(param_filter, (str, re.Pattern)) else param_filter
    try:
        regexes = [convert_glob_to_regex(p) for p in patterns]
    except TypeError:
        raise TypeError(f"param_filter must be a glob pattern, a list of them or a callable "
                        f"(name, param) -> bool, got {param_filter!r}") from None

    def param_filter_fn(name: str, param: torch.Tensor = None) -> bool:
        return any(r.search(name) for r in regexes)

    param_filter_fn.patterns = list(patterns)
    return param_filter_fn


def get_dir_size(path) -> int:
    """The total size in bytes of the files under `path` (recursively; symbolic links are
    not followed)."""
    if not os.path.isdir(path):
        raise NotADirectoryError(f"get_dir_size: {os.fspath(path)!r} is not a directory")
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


@contextlib.contextmanager
def override_env_vars(**kwargs):
    """A context in which the environment variables named by the keywords have the given
    values (str()-ed; None unsets one); the previous values come back on exit."""
    saved = {name: os.environ.get(name) for name in kwargs}
    try:
        for name, value in kwargs.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
