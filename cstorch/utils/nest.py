"""`cerebras.pytorch.utils.nest`: walking nested structures of tensors.

Scopes are lists of strings, one per level: a dict key, a list or tuple index, a
namedtuple or dataclass field name, so that ``".".join(scope)`` names a leaf.
"""
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree

__all__ = ["recurse_spec", "visit_structure", "visit_torch_tensors"]


def _key_name(entry) -> str:
    for attr in ("key", "idx", "name"):   # MappingKey, SequenceKey, GetAttrKey
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def recurse_spec(spec: pytree.TreeSpec, scope: Optional[List[str]] = None) -> Iterator[List[str]]:
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


def visit_structure(data: Any, select_fn, strict: bool = False,
                    scope: Optional[List[str]] = None) -> Iterator[Tuple[List[str], Any]]:
    """(scope, leaf) for every leaf of `data` (dicts, lists, tuples, namedtuples and other
    pytree nodes, recursively) for which `select_fn(leaf)` is true. With `strict`, a leaf
    it rejects raises a TypeError instead of being skipped."""
    prefix = list(scope or [])
    paths, _ = pytree.tree_flatten_with_path(data)
    for path, leaf in paths:
        if select_fn(leaf):
            yield prefix + [_key_name(entry) for entry in path], leaf
        elif strict:
            where = ".".join(prefix + [_key_name(e) for e in path]) or "<root>"
            raise TypeError(f"unexpected {type(leaf).__name__} at {where}")


def visit_torch_tensors(data: Any, scope: Optional[List[str]] = None
                        ) -> Iterator[Tuple[List[str], torch.Tensor]]:
    """(scope, tensor) for every tensor in the nested structure `data`, other leaves
    skipped; `scope` (e.g. ``["input"]``) is prepended to every scope::

        {".".join(s): t for s, t in visit_torch_tensors(batch, scope=["input"])}
    """
    yield from visit_structure(data, lambda leaf: isinstance(leaf, torch.Tensor), scope=scope)
