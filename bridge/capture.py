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
from torch._subclasses.fake_tensor import FakeTensorMode
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


class _RefuseValueReads(TorchFunctionMode):
    def __init__(self, hint: str):
        super().__init__()
        self.hint = hint

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _VALUE_READS:
            name = getattr(func, "__name__", str(func))
            raise TensorValueReadError(
                f"a tensor's value was read ({name}) while the step was being traced, but "
                f"tensor values are not known until the step runs. {self.hint}")
        return func(*args, **(kwargs or {}))


# Ops whose schema hides an in-place update from functionalisation (native_batch_norm
# writes the running statistics without declaring it). The first pass replaces them by
# ops that declare it, so the second pass sees the mutation.
_HIDDEN_MUTATIONS = {op: decomposition_table[op] for op in (torch.ops.aten.native_batch_norm.default,)}


def decompositions():
    """The decomposition table captured graphs are reduced with."""
    return core_aten_decompositions()


def capture(fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
            requires_grad: Sequence[bool] | None = None, *,
            value_read_hint: str = "Read values after the step instead.") -> fx.GraphModule:
    """Trace ``fn(*inputs) -> sequence of tensors`` into a functional core-ATen graph.

    `inputs` give shapes and dtypes only; `fn` runs on fake tensors and never sees their
    data. Inputs flagged in `requires_grad` are autograd leaves, so `fn` may call
    `backward()` on a loss computed from them and read their `.grad`. In-place updates of
    inputs are visible only through what `fn` returns: return every tensor whose new value
    matters. Reading a tensor's value inside `fn` raises `TensorValueReadError` with
    `value_read_hint` appended.
    """
    requires_grad = list(requires_grad or [False] * len(inputs))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fakes(grad_flags):
        with fake_mode:
            out = []
            for t, g in zip(inputs, grad_flags):
                f = fake_mode.from_tensor(t.detach())
                out.append(f.requires_grad_(True) if g else f)
            return out

    def flat_fn(*args):
        return list(fn(*args))

    with fake_mode, _RefuseValueReads(value_read_hint):
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


def _drop_profiler_ops(gm: fx.GraphModule):
    """`record_function` markers (torch.optim wraps every `step` in one) carry no data."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "profiler":
            gm.graph.erase_node(node)
