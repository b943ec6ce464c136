"""An FX graph of functional ATen ops becomes one pure JAX function.

The graph is walked once per JAX trace: under `jax.jit` that happens at compile time, so
no Python runs per op per step afterwards.
"""
import contextlib
import functools
import operator
import os
import re

import jax
import jax.numpy as jnp
import torch
import torch.fx as fx
from torch._ops import OpOverload

from bridge.convert import tensor_to_jax, to_jax_dtype
from bridge.errors import GRADIENT_OF, LoweringError
from bridge.index_checks import CHECKS as INDEX_CHECKS, bounds as index_bounds
from bridge.ops import LOWERINGS
from bridge.ops.random import key_stream
from bridge import scan_blocks, stacked_state
from bridge.precision import matmul_policy

# A write-back of a mutated input left in a graph (bridge.capture removes its own): the
# lowered function returns new values explicitly, so the write-back is the new value.
_WRITE_BACKS = {torch.ops.aten.copy_.default}

# Keys of `node.meta["custom"]` (set while tracing with `torch.fx.traceback.annotate`) that
# shape how a node is lowered:
# - NAME_SCOPE: a JAX scope path ("outer/inner") the op's own scope nests in;
# - MATMUL_POLICY: the `bridge.precision.MatmulPolicy` (None: exact float32) this op's
#   matmuls and convolutions use instead of the policy the whole graph is lowered under.
NAME_SCOPE = "bridge_name_scope"
MATMUL_POLICY = "bridge_matmul_policy"


def source_of(node: fx.Node) -> str | None:
    trace = node.meta.get("stack_trace")
    return trace.strip() if trace else None


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_DIR = os.path.dirname(torch.__file__)


def user_frame(node: fx.Node) -> tuple[str, str] | None:
    """(path, line) of the innermost frame outside torch that made `node` (for a gradient
    op, the line of the forward op it differentiates)."""
    return _user_frame(node.meta.get("stack_trace") or "")


@functools.lru_cache(maxsize=1024)
def _user_frame(stack_trace: str) -> tuple[str, str] | None:
    # Copies of a layer traced once share their stack traces: one parse each.
    for path, line in reversed(_FRAME.findall(stack_trace)):
        if not path.startswith(_TORCH_DIR):
            return path, line
    return None


def user_location(node: fx.Node) -> str | None:
    """``file:line`` of `user_frame`."""
    frame = user_frame(node)
    return None if frame is None else f"{os.path.basename(frame[0])}:{frame[1]}"


def op_name(node: fx.Node) -> str:
    """The node's ATen op as `aten.gather.default`."""
    target = node.target
    return f"{target._schema.name.replace('::', '.')}.{target._overloadname}" \
        if isinstance(target, OpOverload) else getattr(target, "__name__", str(target))


def scope_name(node: fx.Node) -> str:
    """The name an op's JAX ops are grouped under: its ATen op and the user's line, so the
    StableHLO, the optimised HLO and profiles point at model code."""
    name = op_name(node)
    where = user_location(node)
    # '/' separates JAX scopes; a name keeps to one level.
    own = (f"{name} {where}" if where else name).replace("/", "|")
    outer = (node.meta.get("custom") or {}).get(NAME_SCOPE)
    return f"{outer}/{own}" if outer else own


def missing_lowerings(gm: fx.GraphModule) -> list[fx.Node]:
    """The call nodes of `gm` whose op has no lowering."""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, OpOverload)
            and n.target not in LOWERINGS
            and not (n.target in _WRITE_BACKS and n.args[0].op == "placeholder")]


def check_lowerable(gm: fx.GraphModule):
    missing = missing_lowerings(gm)
    if missing:
        node = missing[0]
        gradient = GRADIENT_OF in (node.meta.get("custom") or {})
        raise LoweringError(node.target, source_of(node), gradient)


def _cast_like_meta(node, result):
    """Give each result the dtype PyTorch computed for it (type promotion, int64 indices)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        want = to_jax_dtype(val.dtype)
        if not hasattr(result, "dtype"):
            result = jnp.asarray(result, want)
        elif result.dtype != want:
            result = result.astype(want)
        return result
    if isinstance(val, (tuple, list)) and isinstance(result, (tuple, list)):
        return type(result)(
            r.astype(to_jax_dtype(v.dtype)) if isinstance(v, torch.Tensor) and r is not None
            and r.dtype != to_jax_dtype(v.dtype) else r
            for v, r in zip(val, result))
    return result


class Lowered:
    """What `lower` returns: callable as the JAX function; `checked` lists the ops whose
    results a finite check covers, in the order of its flags; `index_checks` the index
    arguments whose bounds the last output holds (filled when the function is traced);
    `stacked` the groups of state inputs it takes stacked (`bridge.stacked_state`), and
    `stacked_grads` the groups of gradient outputs it returns stacked."""

    def __init__(self, run, checked, index_checks=None, stacked=(), stacked_grads=()):
        self.run, self.checked, self.index_checks = run, checked, index_checks
        self.stacked, self.stacked_grads = stacked, stacked_grads

    def __call__(self, *inputs, key=None):
        return self.run(*inputs, key=key)


def _all_finite(value):
    return jnp.all(jnp.isfinite(value)) if jnp.issubdtype(value.dtype, jnp.inexact) else None


def lower(gm: fx.GraphModule, check_finite: bool = False, check_indices: bool = False,
          remat_loops: bool = False, state_count: int = 0, grad_count: int = 0,
          layer_calls: bool = False) -> Lowered:
    """The JAX function of `gm`: ``fn(*flat_inputs, key=None) -> list of outputs``.

    `key` is the PRNG key random ops draw from, or a function that makes it (called only
    if the graph has random ops); graphs without random ops ignore it.
    Tensors the graph holds as constants become constants of the JAX function.
    Each op runs under a `jax.named_scope` of its ATen name and the user's ``file:line``,
    nested in the node's `NAME_SCOPE` annotation if it has one; a node annotated with
    `MATMUL_POLICY` lowers its products under that policy. Every other matrix product
    and convolution is computed at JAX's highest precision, float32 on every platform.
    With `check_finite`, one more output: a bool vector saying, per floating input and
    op result (`Lowered.checked` names them), whether all its values are finite.
    With `check_indices`, where the graph has ops that take indices, one more output after
    that: an int32 array of shape (n, 2), the smallest and largest index each was given
    (`Lowered.index_checks` holds the n `bridge.index_checks.IndexCheck`s, in order, once
    the function has been traced; without such ops it stays empty and adds no output).
    With `remat_loops`, the gradient loop of marked layers computes their forward ops
    again instead of reading them stacked from the forward loop (`bridge.scan_blocks`).
    With `layer_calls`, marked layers do not loop: each is a call of one jitted function
    of their ops (`scan_blocks.run_calls`), and nothing is stacked.
    With `state_count`, the first `state_count` inputs are the step's state, and its
    first `state_count` outputs their new values: the groups of them that
    `bridge.stacked_state.plan` finds (`Lowered.stacked`, input positions in row order)
    are taken and returned stacked, the whole group at its first position (None at the
    others). With `grad_count`, the next `grad_count` outputs are the gradients the step
    leaves: those that are a loop's stacked output, layer by layer, are returned as that
    array the same way (`Lowered.stacked_grads`, gradient positions in row order).
    """
    check_lowerable(gm)
    constants = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            constants[node.target] = tensor_to_jax(value) if isinstance(value, torch.Tensor) else value
    nodes = list(gm.graph.nodes)
    scopes = {n: scope_name(n) for n in nodes if n.op == "call_function"}
    policies = {n: n.meta["custom"][MATMUL_POLICY] for n in scopes
                if MATMUL_POLICY in (n.meta.get("custom") or {})}
    checked = []
    for i, node in enumerate(n for n in nodes if n.op == "placeholder"):
        checked.append((node, f"input {i} of the step"))
    for node in nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            checked.append((node, scopes[node]))

    index_checks: list = []
    # Layers marked at capture loop (bridge.scan_blocks), except under check_finite, which
    # flags every op's result; under check_indices, loops whose ops take no indices.
    loops = [] if check_finite else scan_blocks.plan(
        gm, unsupported=set(INDEX_CHECKS) if check_indices else set(), remat=remat_loops,
        calls=layer_calls)
    items = scan_blocks.order(gm, loops) if loops else nodes
    draw_numbers = scan_blocks.draw_numbers(gm) if loops else {}
    stacks = bool(loops) and not layer_calls   # whether values may be rows of stacked arrays
    groups = stacked_state.plan(gm, loops, state_count) if stacks and state_count else []
    if stacks and grad_count:
        groups += stacked_state.output_groups(gm, loops, state_count, grad_count)
    in_group = {p for g in groups for p in g}
    rows = None   # the current trace's stacked_state.Rows

    def lower_node(node, args, kwargs):
        if node.target is operator.getitem:
            return operator.getitem(*args)
        policy = matmul_policy(policies[node]) if node in policies else contextlib.nullcontext()
        with jax.named_scope(scopes[node]), policy:
            if node.target in _WRITE_BACKS and node.args[0].op == "placeholder":
                return args[1]
            if stacks and stacked_state.is_elementwise_foreach(node.target):
                return stacked_state.foreach(LOWERINGS[node.target], args, kwargs, rows,
                                             [to_jax_dtype(v.dtype) for v in node.meta["val"]])
            return _cast_like_meta(node, LOWERINGS[node.target](*args, **kwargs))

    def run(*inputs, key=None):
        nonlocal rows
        rows = stacked_state.Rows()
        env = stacked_state.Env(rows)
        if groups:
            inputs = list(inputs)
            for g in (g for g in groups if g[0] < state_count):   # state inputs
                for p, part in zip(g, rows.split(inputs[g[0]])):
                    inputs[p] = part
        index_checks.clear()
        index_values, checked_indices = [], set()
        args_iter = iter(inputs)
        # Products that a lowering leaves at JAX's default precision are float32 on a CPU
        # but TF32 on recent NVIDIA GPUs (a 1e-3 error); eager computes them in float32.
        with key_stream(key if key is not None else jax.random.key(0)) as stream, \
                jax.default_matmul_precision("highest"):
            for node in items:
                if isinstance(node, scan_blocks.Loop) and layer_calls:
                    scan_blocks.run_calls(node, env, lower_node, stream)
                elif isinstance(node, scan_blocks.Loop):
                    scan_blocks.run_loop(node, env, lower_node, rows, stream)
                elif node.op == "placeholder":
                    env[node] = next(args_iter)
                elif node.op == "get_attr":
                    env[node] = constants[node.target]
                elif node.op == "call_function":
                    # An elementwise foreach op takes rows unread: it may run on their stacks.
                    get = env.raw if stacks and (
                        stacked_state.is_elementwise_foreach(node.target)
                        or node.target is operator.getitem) else env.__getitem__
                    args = fx.node.map_arg(node.args, get)
                    kwargs = fx.node.map_arg(node.kwargs, get)
                    if node in draw_numbers:   # the key it draws unrolled, in any order
                        stream.count = draw_numbers[node] - 1
                    env[node] = lower_node(node, args, kwargs)
                    if check_indices and node.target is not operator.getitem:
                        with jax.named_scope(scopes[node]):
                            found, values = index_bounds(node, args, kwargs, op_name(node),
                                                         user_frame(node), checked_indices)
                        index_checks.extend(found)
                        index_values.extend(values)
                elif node.op == "output":
                    outs = list(fx.node.map_arg(node.args[0], env.raw))
                    stacked = {g[0]: rows.stack([outs[q] for q in g]) for g in groups}
                    outs = [stacked.get(p) if p in in_group else rows.read(v)
                            for p, v in enumerate(outs)]
                    if check_finite:
                        outs.append(_finite_flags(checked, env))
                    if index_values:
                        outs.append(jnp.stack(index_values))
                    return outs
                else:
                    raise NotImplementedError(f"FX node kind {node.op!r} is not supported")
    return Lowered(run, [where for _, where in checked] if check_finite else None,
                   index_checks if check_indices else None,
                   tuple(tuple(g) for g in groups if g[0] < state_count),
                   tuple(tuple(p - state_count for p in g) for g in groups
                         if g[0] >= state_count))


def _finite_flags(checked, env):
    flags = []
    for node, _ in checked:
        values = [v for v in jax.tree_util.tree_leaves(env[node]) if hasattr(v, "dtype")]
        parts = [f for f in map(_all_finite, values) if f is not None]
        flags.append(jnp.all(jnp.stack(parts)) if parts else jnp.bool_(True))
    return jnp.stack(flags) if flags else jnp.ones((0,), bool)
