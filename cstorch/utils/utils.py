"""`cerebras.pytorch.utils.utils`: filters that pick parameters by name."""
import fnmatch
import re
from typing import Callable, List, Pattern, Union

import torch

__all__ = ["FilterCallable", "convert_glob_to_regex", "make_param_filter"]

FilterCallable = Callable[[str, torch.Tensor], bool]
"""A parameter filter: ``(name, param) -> bool``, true for the parameters it selects."""


def convert_glob_to_regex(pattern: Union[str, Pattern]) -> Pattern:
    """The compiled regular expression of a glob pattern (``*`` any run of characters,
    ``?`` one character, ``[abc]`` one of a set, as `fnmatch` reads them), matching whole
    names: ``"*proj_[qkv]*.weight"`` matches ``"layers.0.proj_q_dense.weight"``. Use it
    with `search` or `match`; both see the whole name. A compiled pattern is returned
    as is."""
    if isinstance(pattern, re.Pattern):
        return pattern
    if not isinstance(pattern, str):
        raise TypeError(f"a glob pattern is a string, got {type(pattern).__name__}")
    return re.compile("^" + fnmatch.translate(pattern))


def make_param_filter(param_filter: Union[str, List[str], FilterCallable]) -> FilterCallable:
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
