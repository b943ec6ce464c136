"""The pytree side of the format: `set` as a node, leaf keys, and the root spec."""
import collections
import json

import torch.utils._pytree as pytree


def _register_set():
    if set in pytree.SUPPORTED_NODES:
        return
    # The format flattens a set like a list, under the serialized name "builtins.set".
    pytree.register_pytree_node(
        set,
        lambda s: (list(s), None),
        lambda values, _ctx: set(values),
        serialized_type_name="builtins.set",
        flatten_with_keys_fn=lambda s: ([(pytree.SequenceKey(i), v) for i, v in enumerate(s)], None),
    )


_register_set()

ROOT_KEY = "__root__"


def _is_namedtuple_type(t) -> bool:
    return isinstance(t, type) and issubclass(t, tuple) and hasattr(t, "_fields")


def children(spec):
    """A spec's children (torch renamed the accessor; support both spellings)."""
    fn = getattr(type(spec), "children", None)
    if callable(fn):
        return list(spec.children())
    return list(spec.children_specs)


def _child_names(spec):
    t, ctx = spec.type, spec.context
    n = spec.num_children
    if t in (dict, collections.OrderedDict):
        return [str(k) for k in ctx]
    if t is collections.defaultdict:
        return [str(k) for k in ctx[1]]
    if _is_namedtuple_type(t):
        return list(t._fields)
    if isinstance(ctx, type) and hasattr(ctx, "_fields"):  # torch's namedtuple node
        return list(ctx._fields)
    return [str(i) for i in range(n)]


def leaf_keys(spec) -> list:
    """The dotted key of every leaf, in flattening order."""
    keys = []

    def walk(node, prefix):
        if node.is_leaf():
            keys.append(".".join(prefix) if prefix else ROOT_KEY)
            return
        for name, child in zip(_child_names(node), children(node)):
            walk(child, prefix + (name,))

    walk(spec, ())
    return keys


def ensure_namedtuples_registered(obj):
    """torch can only serialize namedtuple nodes it has a name for; give them one."""
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        cls = type(obj)
        if cls not in pytree.SUPPORTED_SERIALIZED_TYPES:
            try:
                pytree._register_namedtuple(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
            except Exception:
                pass
    if isinstance(obj, dict):
        for v in obj.values():
            ensure_namedtuples_registered(v)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            ensure_namedtuples_registered(v)


def stars(obj):
    """The object with leaves replaced by "*", or None where it does not fit JSON."""
    class _NoJSON(Exception):
        pass

    def walk(o):
        if isinstance(o, dict):
            if not all(isinstance(k, str) for k in o):
                raise _NoJSON
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        if isinstance(o, (set, frozenset)):
            raise _NoJSON
        return "*"

    try:
        return walk(obj)
    except _NoJSON:
        return None


def dumps_json(obj) -> str:
    return json.dumps(obj, indent=4)
