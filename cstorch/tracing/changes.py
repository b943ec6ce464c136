"""Why a step was captured again: what differs between two program keys, or two graphs.

`TracedStep` keys its programs by everything they depend on (see `step.py`); when a call
needs a new program while others exist, the difference from the last call's key is
logged, so an unexpected recompilation (a ragged last batch, a flag flipped, a learning
rate set to zero) is easy to find. With `retrace_every_iteration`, each new graph is
compared with the last one.
"""
import difflib

# The parts of a program key, in the order `TracedStep._key` builds it.
_PARTS = ("arguments", "state layout", "train/eval modes", "requires_grad flags",
          "optimizer settings", "micro-batch size", "precision optimization level",
          "check_finite", "check_indices", "default dtype and CPU autocast dtype",
          "scan_blocks", "scan_blocks_remat", "trace_blocks_once")


def _describe_arguments(old, new) -> list:
    old_spec, old_leaves = old
    new_spec, new_leaves = new
    if old_spec != new_spec or len(old_leaves) != len(new_leaves):
        return ["the arguments' structure changed (other arguments, or other containers)"]
    out = []
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves)):
        if a == b:
            continue
        a_t, b_t = _tensor_meta(a), _tensor_meta(b)
        if a_t and b_t:
            shape_a, dtype_a = a_t
            shape_b, dtype_b = b_t
            what = []
            if shape_a != shape_b:
                what.append(f"shape {tuple(shape_a)} -> {tuple(shape_b)}")
            if dtype_a != dtype_b:
                what.append(f"dtype {dtype_a} -> {dtype_b}")
            out.append(f"argument {i}: {', '.join(what)}")
        else:
            out.append(f"argument {i}: its value changed (non-tensor arguments are part of "
                       f"the program)")
    return out


def _tensor_meta(leaf):
    if isinstance(leaf, tuple) and len(leaf) == 3 and leaf[0] == "T":
        return leaf[1], leaf[2]
    if isinstance(leaf, tuple) and len(leaf) == 2 and not isinstance(leaf[0], str):
        return leaf   # the fast path's (shape, dtype)
    return None


def _describe_settings(old, new) -> list:
    if len(old) != len(new):
        return ["the optimizers' param groups changed (a group added, or its keys)"]
    out = []
    for (k, a), (_, b) in zip(old, new):
        if a == b:
            continue
        out.append(f"optimizer setting {k!r}: {_short(a)} -> {_short(b)}")
    return out


def _is_float_flag(part) -> bool:
    """Whether a key's part for a setting is a float's "is zero" flag (step.py)."""
    return isinstance(part, tuple) and len(part) == 2 and part[0] is float \
        and isinstance(part[1], bool)


def _short(value) -> str:
    if _is_float_flag(value):
        return "zero" if value[1] else "non-zero"
    text = repr(value[1] if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type)
                else value)
    return text if len(text) < 60 else text[:57] + "..."


def describe_key_change(old, new) -> list:
    """Plain-language differences between two program keys."""
    out = []
    for i, (name, a, b) in enumerate(zip(_PARTS, old, new)):
        if a == b:
            continue
        if i == 0:
            out += _describe_arguments(a, b)
        elif i == 4:
            out += _describe_settings(a, b)
        elif i == 2:
            out.append("a module was switched between train() and eval()")
        else:
            out.append(f"{name}: {_short(a)} -> {_short(b)}" if i >= 5
                       else f"the {name} changed")
    return out or ["which parameters hold a .grad from earlier steps changed"]


def describe_graph_change(old_code: str, new_code: str, context: int = 0, limit: int = 12) -> list:
    """The differing lines of two captured graphs' code, as a short unified diff."""
    diff = [line for line in difflib.unified_diff(old_code.splitlines(), new_code.splitlines(),
                                                 "last graph", "new graph", n=context, lineterm="")]
    return diff[:limit] + (["..."] if len(diff) > limit else [])
