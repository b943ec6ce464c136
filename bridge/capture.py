"""Capture a Python training step as one functional graph of core ATen ops.

Two passes, as torch 2.x allows for code that calls `loss.backward()` and mutates state:
1. `make_fx` runs the step once on fake tensors with autograd live, so forward, backward
   and the in-place optimizer update all land in one ATen graph.
2. That graph is run again under `functionalize` and the core-ATen decomposition table:
   mutations become new values, views become copies, composite ops become core ops.
The result is a pure function (inputs) -> (outputs) that `bridge.lower` turns into JAX.
"""
from typing import Callable, Sequence

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._decomp import core_aten_decompositions, decomposition_table
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from bridge.errors import TensorValueReadError

_Tensor = torch.Tensor
# Every way Python code can look at a tensor's contents.
_VALUE_READS = {
    _Tensor.item, _Tensor.tolist, _Tensor.numpy, _Tensor.__bool__, _Tensor.__float__,
    _Tensor.__int__, _Tensor.__index__, _Tensor.__repr__, _Tensor.__str__, _Tensor.__format__,
    _Tensor.__array__,
}


class _CaptureMode(TorchFunctionMode):
    """Refuses value reads; hands every real (not traced) tensor argument to `tensor_hook`,
    which returns what the op should see instead (its traced stand-in) or raises."""

    def __init__(self, hint: str, tensor_hook=None):
        super().__init__()
        self.hint = hint
        self.tensor_hook = tensor_hook

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _VALUE_READS:
            name = getattr(func, "__name__", str(func))
            raise TensorValueReadError(
                f"a tensor's value was read ({name}) while the step was being traced, but "
                f"tensor values are not known until the step runs. {self.hint}")
        kwargs = kwargs or {}
        if self.tensor_hook is not None:
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t if isinstance(t, FakeTensor) else self.tensor_hook(t),
                (args, kwargs))
        return func(*args, **kwargs)


# Ops whose schema hides an in-place update from functionalisation (native_batch_norm
# writes the running statistics without declaring it). The first pass replaces them by
# ops that declare it, so the second pass sees the mutation.
_HIDDEN_MUTATIONS = {op: decomposition_table[op] for op in (torch.ops.aten.native_batch_norm.default,)}


def decompositions():
    """The decomposition table captured graphs are reduced with.

    The core-ATen table, plus PyTorch's other decompositions for ops that have no lowering
    of their own (upsampling, grid sampling, `addmv`, ...): reusing PyTorch's rules beats
    hand-writing them, and an op with a lowering is never decomposed further.
    """
    from torch._decomp import decomposition_table
    from bridge.ops import LOWERINGS
    table = core_aten_decompositions()
    for op, fn in decomposition_table.items():
        if (op not in table and op not in LOWERINGS and isinstance(op, torch._ops.OpOverload)
                and "out" not in op._overloadname and not op.name().endswith("_")):
            table[op] = fn
    return table


def capture(fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
            requires_grad: Sequence[bool] | None = None, *,
            value_read_hint: str = "Read values after the step instead.",
            check_lowerings: bool = True, tensor_hook=None) -> fx.GraphModule:
    """Trace ``fn(*inputs) -> sequence of tensors`` into a functional core-ATen graph.

    `inputs` give shapes and dtypes only; `fn` runs on fake tensors and never sees their
    data. Inputs flagged in `requires_grad` are autograd leaves, so `fn` may call
    `backward()` on a loss computed from them and read their `.grad`. In-place updates of
    inputs are visible only through what `fn` returns: return every tensor whose new value
    matters. Reading a tensor's value inside `fn` raises `TensorValueReadError` with
    `value_read_hint` appended. With `check_lowerings`, an op that has no JAX lowering
    raises `LoweringError` here, naming the op, its overload and the user's source line.
    `tensor_hook(t)` sees every real tensor an op inside `fn` receives (one `fn` closed
    over rather than took as an input) and returns the tensor the op uses in its place.
    """
    requires_grad = list(requires_grad or [False] * len(inputs))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fakes(grad_flags):
        with fake_mode:
            out = []
            for t, g in zip(inputs, grad_flags):
                # From shape and dtype only: a lazily created tensor stays unmaterialised.
                f = torch.empty(tuple(t.shape), dtype=t.dtype)
                out.append(f.requires_grad_(True) if g else f)
            return out

    def flat_fn(*args):
        return list(fn(*args))

    _anchor_stack_traces(fn)
    with fake_mode, _CaptureMode(value_read_hint, tensor_hook):
        with torch.enable_grad():
            autograd_graph = make_fx(flat_fn, decomposition_table=_HIDDEN_MUTATIONS,
                                     record_stack_traces=True)(*fakes(requires_grad))

    def replay(*args):
        return fx.Interpreter(autograd_graph).run(*args)

    with fake_mode, fx_traceback.preserve_node_meta():
        functional = torch.func.functionalize(replay, remove="mutations_and_views")
        graph = make_fx(functional, decomposition_table=decompositions(),
                        record_stack_traces=True)(*fakes([False] * len(inputs)))
    _drop_profiler_ops(graph)
    _outputs_after_mutation(graph)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    if check_lowerings:
        from bridge.lower import check_lowerable
        check_lowerable(graph)
    return graph


def _outputs_after_mutation(gm: fx.GraphModule):
    """Functionalisation writes mutated inputs back with trailing `copy_(input, value)` and
    may still return the input itself (a kernel such as batch norm mutated it in place).
    The function returned that tensor after the mutation, so the graph returns `value`;
    the write-backs then have nothing left to do and go."""
    final = {}
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
                and node.args[0].op == "placeholder"):
            final[node.args[0]] = node.args[1]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = fx.node.map_arg(output.args, lambda n: final.get(n, n))
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in final:
            gm.graph.erase_node(node)


def _anchor_stack_traces(fn):
    """Make the tracer keep `fn`'s frames in each node's stack trace.

    make_fx records only frames named `forward` (nn.Module code) unless a function is
    registered as an anchor; a step function is not a `forward`, and without its frames an
    error about an op could not point at the user's line. The second pass copies the
    first pass's `stack_trace` through `preserve_node_meta`.
    """
    try:
        from torch.fx.proxy import _register_stack_trace_anchor
    except ImportError:  # a torch without anchors: traces keep `forward` frames only
        return
    target = getattr(fn, "__func__", fn)
    if not hasattr(target, "__code__"):
        target = getattr(type(fn), "__call__", None)
    while hasattr(target, "__wrapped__") and not hasattr(target, "__code__"):
        target = target.__wrapped__
    if hasattr(target, "__code__"):
        _register_stack_trace_anchor(target)


def _drop_profiler_ops(gm: fx.GraphModule):
    """`record_function` markers (torch.optim wraps every `step` in one) carry no data."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "profiler":
            gm.graph.erase_node(node)
