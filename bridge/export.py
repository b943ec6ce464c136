"""A `torch.export.ExportedProgram` becomes a JAX function and its state as arrays.

The program is first decomposed to core ATen with the same table `bridge.capture` uses,
then its graph goes through `bridge.lower` like a captured step. Parameters, buffers and
lifted constants leave the program as one dict of JAX arrays keyed by their state-dict
names, so a JAX user can jit, grad or shard the function over them.
"""
from typing import Any
from collections.abc import Callable

import jax
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from bridge.capture import capture, decompositions
from bridge.convert import tensor_to_jax
from bridge.errors import DynamicShapeError
from bridge.lower import check_lowerable, lower


def _refuse_dynamic_dims(ep: ExportedProgram):
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for i, size in enumerate(val.shape):
                if not isinstance(size, int):
                    raise DynamicShapeError(
                        f"input '{node.name}' has a dynamic dimension {i} (size {size}); "
                        "bridge.to_jax lowers static shapes only. Export again without "
                        "`dynamic_shapes` for that dim (XLA compiles one program per shape).")


def _plain(tree):
    """`tree` with mapping classes JAX does not know (a Hugging Face `ModelOutput`) as
    plain dicts and namedtuples as tuples, so a jitted `fn` can return it."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_plain(v) for v in tree) if type(tree) in (list, tuple) \
            else tuple(_plain(v) for v in tree)
    return tree


def _retrace(ep: ExportedProgram, error: Exception) -> torch.fx.GraphModule:
    """The program's graph decomposed by `bridge.capture` instead of `run_decompositions`.

    `run_decompositions` re-traces with export's own view handling and fails on some
    programs that run fine (GPT-2: a `view` of a tensor whose decomposed strides are not
    viewable). The lifted graph is already functional and takes the flat inputs in
    signature order, so functionalising and decomposing it as a step gives the same
    function with the same inputs and outputs.
    """
    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        raise error
    graph = ep.graph_module

    def flat(*args):
        out = graph(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]
    return capture(flat, vals, check_lowerings=False)


def to_jax(ep: ExportedProgram) -> tuple[Callable[..., Any], dict[str, jax.Array]]:
    """``(fn, state)`` for `ep`: ``fn(state, *args, key=None, **kwargs)`` runs the program.

    `state` maps each parameter, buffer and lifted constant name to a JAX array. `fn`
    takes the program's user inputs as JAX arrays (non-tensor inputs as the values the
    program was exported with) and returns its outputs in the program's output
    structure (a Hugging Face `ModelOutput` or other mapping as a plain dict, a
    namedtuple as a tuple, which `jax.jit` can return). A program that also writes state
    (buffer mutations, or the gradients of a joint forward-backward program from
    `torch.export`'s experimental tools) returns
    ``(outputs, updates)`` with ``updates = {"buffers": {...}, "grads": {...},
    "inputs": {...}}`` keyed by state/input name; `fn.has_updates` says which form.
    Random ops draw from `key` (a `jax.random.key`).
    Raises `DynamicShapeError` naming the input and dim if any dim is symbolic.
    """
    _refuse_dynamic_dims(ep)
    try:
        ep = ep.run_decompositions(decompositions())
        gm = ep.graph_module
    except Exception as error:
        gm = _retrace(ep, error)
    check_lowerable(gm)
    lowered = lower(gm)
    sig = ep.graph_signature

    state: dict[str, jax.Array] = {}
    placeholders = []  # per graph input: ("state", name) or ("user", None)
    for spec in sig.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            name = spec.target
            value = ep.state_dict[name] if name in ep.state_dict else ep.constants[name]
            state[name] = tensor_to_jax(value)
            placeholders.append(("state", name))
        elif spec.kind == InputKind.USER_INPUT:
            placeholders.append(("user", spec.arg.name))
        else:
            raise NotImplementedError(f"exported input of kind {spec.kind.name} "
                                      f"('{spec.arg.name}') is not supported by bridge.to_jax")

    user_outputs, updates = [], []  # updates: (section, name, position)
    for i, spec in enumerate(sig.output_specs):
        if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            user_outputs.append(i)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            updates.append(("buffers", spec.target, i))
        elif spec.kind == OutputKind.GRADIENT_TO_PARAMETER:
            updates.append(("grads", spec.target, i))
        elif spec.kind == OutputKind.GRADIENT_TO_USER_INPUT:
            updates.append(("grads", spec.target, i))
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            updates.append(("inputs", spec.target, i))
        else:
            raise NotImplementedError(f"exported output of kind {spec.kind.name} is not "
                                      "supported by bridge.to_jax")
    out_spec = ep.call_spec.out_spec

    def fn(state, *args, key=None, **kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        if len(leaves) != sum(1 for kind, _ in placeholders if kind == "user"):
            raise TypeError(f"the exported program takes "
                            f"{sum(1 for k, _ in placeholders if k == 'user')} user inputs, "
                            f"got {len(leaves)}")
        it = iter(leaves)
        flat = [state[name] if kind == "state" else next(it) for kind, name in placeholders]
        outs = lowered(*flat, key=key)
        user = [outs[i] for i in user_outputs]
        try:
            user = _plain(pytree.tree_unflatten(user, out_spec)) if out_spec is not None else user
        except Exception:  # a joint program's outputs do not follow the forward's spec
            pass
        if not updates:
            return user
        grouped = {"buffers": {}, "grads": {}, "inputs": {}}
        for section, name, i in updates:
            grouped[section][name] = outs[i]
        return user, grouped

    fn.has_updates = bool(updates)
    fn.graph_module = gm
    return fn, state
