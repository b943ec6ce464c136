"""Whether two callables recorded by two captures of a step do the same thing when called.

A step closure is recorded as the function object the step called, and Python makes new
function objects freely: a method decorated with `@cstorch.step_closure` is wrapped again
at each capture, and a function defined inside a callback (`def log(): ...` then
`cstorch.step_closure(log)()`) is a new object at every call of the callback. Two captures
of an unchanged step therefore record different objects that run the same code on the same
values; told apart by identity, every capture of such a step looked like a new program, so
a Python value the step never reads (a trainer's global step) captured it again at every
step.

Two callables are the same here when they are the same object, or the same code over the
same globals with the same defaults and the same values in their closure cells: objects
by identity, plain values by `python_values.same`, callables by this rule again (a
decorator's wrapper closes over the function it wraps). A bound method: the same function
bound to the same object. Anything else is compared by identity, so a doubt keeps the two
apart, and a step whose closure would behave otherwise is captured again.
"""
import functools
import types

from cstorch.tracing import python_values

# How many wrappers deep the comparison follows closure cells: decorators nest a few.
_DEPTH = 8


def same_callable(a, b, depth: int = 0) -> bool:
    """Whether calling `a` and calling `b` run the same code on the same values."""
    if a is b:
        return True
    if type(a) is not type(b) or depth > _DEPTH:
        return False
    if isinstance(a, types.MethodType):
        return a.__self__ is b.__self__ and same_callable(a.__func__, b.__func__, depth + 1)
    if isinstance(a, functools.partial):
        return (same_callable(a.func, b.func, depth + 1) and _same_values(a.args, b.args, depth)
                and a.keywords.keys() == b.keywords.keys()
                and _same_values(list(a.keywords.values()),
                                 [b.keywords[k] for k in a.keywords], depth))
    if not isinstance(a, types.FunctionType):
        return False
    if a.__code__ is not b.__code__ or a.__globals__ is not b.__globals__:
        return False
    if not _same_values(a.__defaults__ or (), b.__defaults__ or (), depth):
        return False
    kw_a, kw_b = a.__kwdefaults__ or {}, b.__kwdefaults__ or {}
    if kw_a.keys() != kw_b.keys() or not _same_values(list(kw_a.values()),
                                                        [kw_b[k] for k in kw_a], depth):
        return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    return len(cells_a) == len(cells_b) and _same_values(
        [_contents(c) for c in cells_a], [_contents(c) for c in cells_b], depth)


_EMPTY = object()


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a closure variable not assigned yet
        return _EMPTY


def _same_values(xs, ys, depth) -> bool:
    return len(xs) == len(ys) and all(_same_value(x, y, depth) for x, y in zip(xs, ys))


def _same_value(x, y, depth) -> bool:
    if x is y:
        return True
    if callable(x) and isinstance(x, (types.FunctionType, types.MethodType, functools.partial)):
        return same_callable(x, y, depth + 1)
    # A plain value (a number, a string, a tuple of those) is the same when equal and of
    # the same type; an object, a list or a dict only when it is the same object.
    return python_values._plain(x) and python_values.same(x, y)
