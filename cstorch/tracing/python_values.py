"""Python values a captured program may depend on: the attributes of the compiled modules,
and the globals and closure variables of the step and of the code it calls.

`forward` may read `self.temperature`, `self.dropout.p` or a mask tensor `self.mask`, and
the step a global `SCALE`: the captured program holds the values they had then. Each
program therefore keeps these values (numbers, NumPy scalars included, strings, None,
dtypes, enum members, tuples of those; and tensors and functions, compared by identity, so
that rebinding `self.mask` to another tensor or `self.act` to another function is seen) as
they were at the end of its capture, and is taken only while they still hold them;
otherwise the step is captured again, as eager PyTorch would compute with the new value.
(A tensor written in place is the closed-over constants' concern: `Program.constants`.)

Watched: such attributes in a compiled submodule's `__dict__`; such globals that the step
function and the modules' `forward` methods name, and those of the functions and module
methods they name, recursively (PyTorch's, JAX's and this package's own functions are not
looked into); such closure variables of those functions; and the attributes of the modules
those globals and closure variables hold (a loss module's `reduction`), whose methods are
looked into as well. Where any of these holds a plain object (a config object, a
dataclass, a namespace), a dict or a list, the values inside it are watched too
(`self.cfg.use_path_b`, `CONFIG["scale"]`), a few levels deep; not in those of a
library's module (torch's, a cstorch metric), which hold its bookkeeping. An object that
cannot be looked into (no `__dict__`, no slots) warns once, naming it.

A value whose change left the captured program exactly as it was (a counter kept on a
module, never read by the step) is not watched by the program that replaces it, so it costs
one capture, not one per call.
"""
import argparse
import dataclasses
import enum
import functools
import sys
import types
import warnings

import numpy as np
import torch

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)
# `training` is part of every program's key already; `_is_full_backward_hook` is set by
# torch itself when a module is called.
_NOT_WATCHED = frozenset({"training", "_is_full_backward_hook"})
_MISSING = object()
# Libraries whose functions are not looked into: their globals are their own settings.
_LIBRARIES = frozenset({"torch", "jax", "jaxlib", "numpy", "cstorch", "bridge", "wafer"})
# A module's own tables (parameters, buffers, submodules, hooks) are not values it computes
# with; they are state or hooks, watched elsewhere.
_MODULE_TABLES = frozenset(vars(torch.nn.Module()))
# How far into objects, dicts and lists a value is looked for, and how many values one
# container may add: a tokenizer's vocabulary is not a setting.
_DEPTH, _MAX_ITEMS = 4, 256
# The standard library's objects that hold settings.
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)


# Watched by identity: a tensor (its writes are `Program.constants`' concern) and a function
# (`self.act = F.relu`, then `torch.tanh`).
_BY_IDENTITY = (torch.Tensor, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                functools.partial)


def _plain(value) -> bool:
    """Whether `value` is watched: a plain value (a NumPy scalar too: `np.sqrt(d)`; an enum
    member), a tensor or a function, or a tuple of those."""
    kind = type(value)
    if kind in _PLAIN or isinstance(value, _BY_IDENTITY + (np.number, np.bool_, enum.Enum)):
        return True
    if kind is tuple:
        return all(_plain(v) for v in value)
    return kind is frozenset and all(type(v) in _PLAIN for v in value)


def same(a, b) -> bool:
    """Whether two watched values would be captured alike: 1, 1.0 and True are different
    values here (they promote differently), NaN is the same as NaN, and a tensor or a
    function is only the same as itself."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b) or isinstance(a, _BY_IDENTITY):
        return False
    if kind is tuple:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


# A watched value is (where it lives, the name a message gives it, its key, its value at
# the capture). Where it lives is a dict (a module's `__dict__`, a function's globals) read
# at the key, or a closure cell, whose key is None.

def module_attributes(named_modules) -> tuple:
    """The plain attributes of `named_modules` ((qualified name, module) pairs), and the
    plain values inside the objects, dicts and lists they hold."""
    found, seen = [], set()
    for name, module in named_modules:
        # A library's module (torch's, a cstorch metric) keeps its own bookkeeping in its
        # containers; its settings are plain attributes.
        look_inside = type(module).__module__.split(".")[0] not in _LIBRARIES
        for attr, value in module.__dict__.items():
            if attr in _NOT_WATCHED or attr in _MODULE_TABLES:
                continue
            if _plain(value):
                found.append((module.__dict__, f"{name}.{attr}", attr, value))
            elif look_inside:
                _inside(value, f"{name}.{attr}", found, seen)
    return tuple(found)


class _Items:
    """A list read like a dict by index, as the watch reads every place it looks at."""
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items

    def get(self, i, default):
        return self.items[i] if i < len(self.items) else default


class _Slots:
    """An object with `__slots__` read like a dict by attribute name."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def get(self, name, default):
        return getattr(self.obj, name, default)


_warned_opaque: set = set()


def _inside(value, label, found, seen, depth=0):
    """Append to `found` the watched values inside `value` (an object, dict or list that a
    watched place holds), as (where, name, key, value) entries."""
    kind = type(value)
    if (depth >= _DEPTH or id(value) in seen or isinstance(value, (torch.nn.Module, type))
            or isinstance(value, types.ModuleType) or callable(value) and kind not in (dict, list)):
        return
    if kind in (dict, list):
        where, items = (value, value.items()) if kind is dict else (_Items(value), enumerate(value))
        if len(value) > _MAX_ITEMS:
            return
        seen.add(id(value))
        for key, v in items:
            sub = f"{label}[{key!r}]"
            if _plain(v):
                found.append((where, sub, key, v))
            else:
                _inside(v, sub, found, seen, depth + 1)
        return
    top = kind.__module__.split(".")[0]
    if top in _LIBRARIES or top in sys.stdlib_module_names and kind not in _NAMESPACES:
        return   # a library's object (a backend, a logger, an optimizer), not a setting
    attrs = getattr(value, "__dict__", None)
    slots = [n for c in kind.__mro__ for n in getattr(c, "__slots__", ())
             if isinstance(n, str) and n not in ("__dict__", "__weakref__")]
    if attrs is None and not slots:
        if kind not in _warned_opaque:
            _warned_opaque.add(kind)
            warnings.warn(f"cstorch: {label} holds a {kind.__qualname__}, whose contents "
                          f"cannot be watched: a change to it between steps is not seen by "
                          f"the compiled step. Pass such a value to the step as an argument, "
                          f"or hold it in a plain object or dict.", stacklevel=2)
        return
    seen.add(id(value))
    entries = []
    if attrs is not None:
        entries += [(attrs, k, v) for k, v in attrs.items()]
    if slots:
        view = _Slots(value)
        entries += [(view, k, getattr(value, k)) for k in slots if hasattr(value, k)]
    if dataclasses.is_dataclass(value) or len(entries) <= _MAX_ITEMS:
        for where, key, v in entries:
            sub = f"{label}.{key}"
            if _plain(v):
                found.append((where, sub, key, v))
            else:
                _inside(v, sub, found, seen, depth + 1)


def function_values(fns, methods=None, modules=()) -> tuple:
    """The plain globals and closure variables of `fns`, and of the functions they name or
    close over, recursively. A name that `methods` maps (name -> functions: the methods of
    the modules, which code reaches as `self.name`) leads to those functions too. A module
    held by such a global or closure variable that is not one of `modules` (watched through
    `module_attributes`) has its attributes and its submodules' watched, and the methods
    of their classes looked into."""
    methods = methods or {}
    found, seen, inner = {}, set(), set()
    functions = [getattr(fn, "__func__", fn) for fn in fns]   # a bound method: its function
    known = {id(m) for m in modules}

    def reach(module, label):
        for name, m in module.named_modules(prefix=label):
            if id(m) in known:
                continue
            known.add(id(m))
            for watched in module_attributes([(name, m)]):
                found[id(watched[0]), watched[2]] = watched
            functions.extend(f for cls in type(m).__mro__ for f in vars(cls).values()
                             if isinstance(f, types.FunctionType))
    while functions:
        f = functions.pop()
        if not isinstance(f, types.FunctionType) or f.__code__ in seen or _library(f):
            continue
        seen.add(f.__code__)
        names, codes = set(), [f.__code__]
        while codes:   # the function's code and the lambdas and comprehensions in it
            code = codes.pop()
            names.update(code.co_names)
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        g = f.__globals__
        for name in sorted(names):
            functions.extend(methods.get(name, ()))
            value = g.get(name, _MISSING)
            if isinstance(value, types.FunctionType):
                functions.append(value)   # looked into, and watched (below) by identity
            elif isinstance(value, torch.nn.Module):
                reach(value, name)
            label = f"global {name} of {g.get('__name__', '?')}"
            if value is not _MISSING and _plain(value):
                found[id(g), name] = (g, label, name, value)
            elif value is not _MISSING:
                for watched in _in(value, label, inner):
                    found[id(watched[0]), watched[2]] = watched
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            value = _contents(cell)
            if isinstance(value, types.FunctionType):   # a decorator's wrapped function
                functions.append(value)
            elif isinstance(value, torch.nn.Module):
                reach(value, name)
            label = f"closure variable {name} of {f.__qualname__}"
            if value is not _MISSING and _plain(value):
                found[id(cell), None] = (cell, label, None, value)
            elif value is not _MISSING:
                for watched in _in(value, label, inner):
                    found[id(watched[0]), watched[2]] = watched
    return tuple(found.values())   # a global that two functions name, once


def _in(value, label, seen) -> list:
    found: list = []
    _inside(value, label, found, seen)
    return found


def _library(fn) -> bool:
    return str(fn.__module__).split(".")[0] in _LIBRARIES


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a closure variable not assigned yet
        return _MISSING


def _now(where, key):
    return _contents(where) if key is None else where.get(key, _MISSING)


def first_change(watched) -> tuple | None:
    """(name, value at the capture, value now) of the first watched value that has
    changed, or None."""
    for where, name, key, value in watched:
        # `_now` written out: this runs for every watched value at every call.
        now = _contents(where) if key is None else where.get(key, _MISSING)
        if now is not value and not same(now, value):
            return name, value, now
    return None


def changes(watched) -> list:
    """The names of every watched value that has changed."""
    return [name for where, name, key, value in watched if not same(_now(where, key), value)]


def describe(value) -> str:
    if value is _MISSING:
        return "(deleted)"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, _BY_IDENTITY):   # a function: a builtin's qualified name is torch's
        fn = value.func if isinstance(value, functools.partial) else value
        name = fn.__qualname__ if isinstance(fn, types.FunctionType) else fn.__name__
        return f"the function {name}"
    if type(value) is tuple:
        return "(" + ", ".join(describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)
