"""`cerebras.pytorch.utils.nest`: walking nested structures of tensors.

Scopes are lists of strings, one per level: a dict key, a list or tuple index, a
namedtuple or dataclass field name, so that ``".".join(scope)`` names a leaf.

A structure is walked through the visit function registered for its type
(`register_visit_fn`): lists and tuples (`visit_list_tuple`) and dicts (`visit_dict`) come
registered; other containers that `torch.utils._pytree` knows (namedtuples, registered
dataclasses) are walked through their pytree children. A visit function takes the
structure and yields ``(scope, child)`` pairs, `scope` a list of strings.
"""
import importlib
import inspect
from typing import Any
from collections.abc import Callable, Iterator

import torch
import torch.utils._pytree as pytree

from bridge.device_tensor import DeviceTensor

__all__ = ["recurse_spec", "visit_structure", "visit_torch_tensors", "visit_device_tensors",
           "visit_lazy_tensors", "map_structure", "map_torch_tensors", "map_lazy_tensors",
           "diff", "register_visit_fn", "unregister_visit_fn", "find_visit_fn", "visit_dict",
           "visit_list_tuple", "serialize_visit_fns", "deserialize_visit_fns"]

_visit_fns: dict[type, Callable] = {}


def register_visit_fn(*types):
    """A decorator registering a visit function for each of `types`: it takes a structure
    of that type and yields ``(scope, child)`` pairs."""
    for t in types:
        if not isinstance(t, type):
            raise TypeError(f"register_visit_fn takes types, got {t!r}")

    def register(fn):
        for t in types:
            _visit_fns[t] = fn
        return fn
    return register


def unregister_visit_fn(*types):
    """Forget the visit functions of `types` (types without one are ignored)."""
    for t in types:
        _visit_fns.pop(t, None)


def find_visit_fn(struct) -> Callable | None:
    """The visit function registered for `struct`'s type, or for the nearest of its base
    classes; None when there is none."""
    for t in type(struct).__mro__:
        if t in _visit_fns:
            return _visit_fns[t]
    return None


@register_visit_fn(list, tuple)
def visit_list_tuple(struct):
    """The items of a list or tuple, scoped by index (a namedtuple's by field name)."""
    names = getattr(struct, "_fields", None)
    for i, item in enumerate(struct):
        yield [str(names[i]) if names else str(i)], item


@register_visit_fn(dict)
def visit_dict(struct):
    """The values of a dict, scoped by key."""
    for key, value in struct.items():
        yield [str(key)], value


def _children(struct) -> Iterator[tuple[list[str], Any]] | None:
    """``(scope, child)`` of a structure, or None for a leaf."""
    fn = find_visit_fn(struct)
    if fn is not None:
        return fn(struct)
    if type(struct) in pytree.SUPPORTED_NODES and struct is not None:
        children, context = pytree.SUPPORTED_NODES[type(struct)].flatten_fn(struct)
        names = context if isinstance(context, (list, tuple)) and len(context) == len(children) \
            else range(len(children))
        return (([str(n)], c) for n, c in zip(names, children))
    return None


def _key_name(entry) -> str:
    for attr in ("key", "idx", "name"):   # MappingKey, SequenceKey, GetAttrKey
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def recurse_spec(spec: pytree.TreeSpec, scope: list[str] | None = None) -> Iterator[list[str]]:
    """The scope of every leaf of a `torch.utils._pytree` spec, in the order
    `tree_flatten` gives the leaves, so that::

        values, spec = tree_flatten(state_dict)
        dict(zip(map(".".join, recurse_spec(spec)), values))

    is the flat, dotted view of `state_dict`. `scope` is prepended to every scope. A spec
    of a single leaf yields `scope` (or []) once.
    """
    if not isinstance(spec, pytree.TreeSpec):
        raise TypeError(f"recurse_spec expects a torch.utils._pytree.TreeSpec, got "
                        f"{type(spec).__name__}")
    prefix = list(scope or [])
    placeholder = pytree.tree_unflatten([0] * spec.num_leaves, spec)
    paths, _ = pytree.tree_flatten_with_path(placeholder)
    for path, _leaf in paths:
        yield prefix + [_key_name(entry) for entry in path]


def visit_structure(data_structure: Any, select_fn, strict: bool = False,
                    scope: list[str] | None = None) -> Iterator[tuple[list[str], Any]]:
    """(scope, leaf) for every leaf of `data_structure` (walked recursively, see the module
    doc) for which `select_fn(leaf)` is true. With `strict`, a leaf it rejects raises a
    TypeError instead of being skipped."""
    prefix = list(scope or [])
    if select_fn(data_structure):
        yield prefix, data_structure
        return
    children = _children(data_structure)
    if children is None:
        if strict:
            where = ".".join(prefix) or "<root>"
            raise TypeError(f"unexpected {type(data_structure).__name__} at {where}")
        return
    for sub, child in children:
        yield from visit_structure(child, select_fn, strict, prefix + list(sub))


def visit_torch_tensors(data_structure: Any, strict: bool = False,
                        scope: list[str] | None = None
                        ) -> Iterator[tuple[list[str], torch.Tensor]]:
    """(scope, tensor) for every tensor in the nested structure, other leaves skipped
    (an error with `strict`); `scope` (e.g. ``["input"]``) is prepended to every scope::

        {".".join(s): t for s, t in visit_torch_tensors(batch, scope=["input"])}
    """
    yield from visit_structure(data_structure, lambda leaf: isinstance(leaf, torch.Tensor),
                               strict=strict, scope=scope)


def visit_device_tensors(data_structure: Any, device_type: str, strict: bool = False,
                         scope: list[str] | None = None
                         ) -> Iterator[tuple[list[str], torch.Tensor]]:
    """(scope, tensor) for every tensor on a device of type `device_type` (``"cpu"``,
    ``"cuda"``, ...)."""
    yield from visit_structure(
        data_structure,
        lambda leaf: isinstance(leaf, torch.Tensor) and leaf.device.type == device_type,
        strict=strict, scope=scope)


def _is_lazy(leaf) -> bool:
    return isinstance(leaf, DeviceTensor)


def visit_lazy_tensors(data_structure: Any, strict: bool = False,
                       scope: list[str] | None = None
                       ) -> Iterator[tuple[list[str], torch.Tensor]]:
    """(scope, tensor) for every tensor held by the backend (the real package's lazy
    tensors: here a compiled model's parameters and a traced step's results)."""
    yield from visit_structure(data_structure, _is_lazy, strict=strict, scope=scope)


def _call(map_fn):
    """map_fn as ``(scope, value) -> new value``; a function of one argument gets the value."""
    try:
        params = [p for p in inspect.signature(map_fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return map_fn
    if len(params) == 1 and params[0].kind is not params[0].VAR_POSITIONAL:
        return lambda scope, value: map_fn(value)
    return map_fn


def map_structure(map_fn: Callable, data_structure: Any, select_fn: Callable,
                  scope: list[str] | None = None) -> Any:
    """A copy of `data_structure` in which every leaf that `select_fn` picks is replaced by
    ``map_fn(scope, leaf)`` (``map_fn(leaf)`` for a function of one argument). Lists,
    tuples, namedtuples and dicts are rebuilt as their own type; other leaves are kept."""
    return _map(_call(map_fn), data_structure, select_fn, list(scope or []))


def _map(fn, struct, select_fn, scope):
    if select_fn(struct):
        return fn(scope, struct)
    if isinstance(struct, dict) and find_visit_fn(struct) is visit_dict:
        out = {k: _map(fn, v, select_fn, scope + [str(k)]) for k, v in struct.items()}
        if type(struct) is dict:
            return out
        try:
            return type(struct)(out)
        except TypeError:
            return out
    if isinstance(struct, (list, tuple)) and find_visit_fn(struct) is visit_list_tuple:
        items = [_map(fn, v, select_fn, scope + [s[0]])
                 for s, v in visit_list_tuple(struct)]
        if hasattr(struct, "_fields"):
            return type(struct)(*items)
        return type(struct)(items)
    if find_visit_fn(struct) is None and type(struct) in pytree.SUPPORTED_NODES:
        node = pytree.SUPPORTED_NODES[type(struct)]
        children, context = node.flatten_fn(struct)
        scoped = list(_children(struct))
        mapped = [_map(fn, c, select_fn, scope + s) for s, c in scoped]
        return node.unflatten_fn(mapped, context)
    return struct


def map_torch_tensors(map_fn: Callable, data_structure: Any,
                      scope: list[str] | None = None) -> Any:
    """`map_structure` over the tensors of `data_structure`."""
    return map_structure(map_fn, data_structure, lambda x: isinstance(x, torch.Tensor), scope)


def map_lazy_tensors(map_fn: Callable, data_structure: Any,
                     scope: list[str] | None = None) -> Any:
    """`map_structure` over the backend's tensors in `data_structure` (see
    `visit_lazy_tensors`)."""
    return map_structure(map_fn, data_structure, _is_lazy, scope)


def diff(data_structure_1: Any, data_structure_2: Any) -> list[str]:
    """Where two structures differ, one line per difference, each naming the dotted scope:
    a key or index only one of them has, containers of different types, or leaves that
    differ (tensors by shape, dtype and value, other leaves by ``==``). Empty when they
    are the same."""
    out: list[str] = []
    _diff(data_structure_1, data_structure_2, [], out)
    return out


def _diff(a, b, scope, out):
    where = ".".join(scope) or "<root>"
    ca, cb = _children(a), _children(b)
    if ca is None or cb is None:
        if ca is not None or cb is not None:
            out.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        elif not _same_leaf(a, b):
            out.append(f"{where}: {_short(a)} vs {_short(b)}")
        return
    if type(a) is not type(b):
        out.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
        return
    da = {tuple(s): c for s, c in ca}
    db = {tuple(s): c for s, c in cb}
    for key in da:
        if key not in db:
            out.append(f"{'.'.join(scope + list(key))}: only in the first structure")
        else:
            _diff(da[key], db[key], scope + list(key), out)
    for key in db:
        if key not in da:
            out.append(f"{'.'.join(scope + list(key))}: only in the second structure")


def _same_leaf(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and bool(
            torch.equal(a.detach().cpu(), b.detach().cpu()))
    try:
        return bool(a == b)
    except Exception:   # leaves whose == does not give a truth value differ
        return False


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _path(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _resolve(path: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(f"cannot import {path!r}")


def serialize_visit_fns() -> dict[str, str]:
    """The registered visit functions as ``{type path: function path}`` (dotted import
    paths), for `deserialize_visit_fns` in another process."""
    return {_path(t): _path(fn) for t, fn in _visit_fns.items()}


def deserialize_visit_fns(visit_fn_map: dict[str, str]) -> None:
    """Import and register the visit functions of a `serialize_visit_fns` map."""
    for type_path, fn_path in visit_fn_map.items():
        register_visit_fn(_resolve(type_path))(_resolve(fn_path))
