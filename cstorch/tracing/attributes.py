"""Plain Python attributes of the compiled modules, which a captured program may depend on.

`forward` may read `self.temperature` or `self.dropout.p` as a Python value: the captured
program holds the value it had then. Each program therefore keeps the plain attributes
(numbers, strings, None, dtypes, tuples of those) of every compiled submodule as they were
at the end of its capture, and is taken only while they still hold those values; otherwise
the step is captured again, as eager PyTorch would compute with the new value.

An attribute whose change left the captured program exactly as it was (a counter kept on a
module, never read by the step) is not watched by the program that replaces it, so it costs
one capture, not one per call.
"""
import torch

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)
# `training` is part of every program's key already; `_is_full_backward_hook` is set by
# torch itself when a module is called.
_NOT_WATCHED = frozenset({"training", "_is_full_backward_hook"})
_MISSING = object()


def _plain(value) -> bool:
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind is tuple or kind is frozenset:
        return all(_plain(v) for v in value)
    return False


def same(a, b) -> bool:
    """Whether two plain values would be captured alike: 1, 1.0 and True are different
    values here (they promote differently), and NaN is the same as NaN."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is tuple:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def snapshot(named_modules) -> tuple:
    """(module's `__dict__`, qualified attribute name, attribute, value) of every plain
    attribute of `named_modules` ((name, module) pairs)."""
    return tuple((module.__dict__, f"{name}.{attr}", attr, value)
                 for name, module in named_modules
                 for attr, value in module.__dict__.items()
                 if attr not in _NOT_WATCHED and _plain(value))


def first_change(watched) -> tuple | None:
    """(qualified name, value at the capture, value now) of the first watched attribute
    that no longer holds its value, or None."""
    for attrs, name, attr, value in watched:
        now = attrs.get(attr, _MISSING)
        if now is not value and not same(now, value):
            return name, value, now
    return None


def changes(watched) -> list:
    """The qualified names of every watched attribute that no longer holds its value."""
    return [name for attrs, name, attr, value in watched
            if not same(attrs.get(attr, _MISSING), value)]


def describe(value) -> str:
    return "(deleted)" if value is _MISSING else repr(value)
