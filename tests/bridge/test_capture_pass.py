"""The capture runs the step's Python once, functionalising and decomposing as it traces:
what the step's own code sees of a decomposed op (its strides) is what eager code sees,
and library code can tell that it is being compiled."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental import proxy_tensor

import bridge
import cerebras.pytorch as cstorch


@pytest.fixture
def backend():
    return cstorch.backend("CPU")


class HeadsMergedWithView(nn.Module):
    """Attention whose heads are merged as GPT-2 merges them: `.transpose(1, 2)`, a
    reshape, then `.view`, which only works on the attention kernel's memory order."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.strides = []

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=2))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        self.strides.append(o.stride())
        merged = o.transpose(1, 2).reshape(b, n, d)
        return self.out(merged.view(-1, d)).view(b, n, d)


def test_attention_output_keeps_the_kernels_layout_in_the_step(backend):
    torch.manual_seed(0)
    eager = HeadsMergedWithView()
    traced_model = HeadsMergedWithView()
    traced_model.load_state_dict(eager.state_dict())
    model = cstorch.compile(traced_model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        x = torch.randn(2, 8, 16)
        got = float(step(x))
        want = eager(x).square().mean()
        eager_optimizer.zero_grad()
        want.backward()
        eager_optimizer.step()
        assert got == pytest.approx(want.item(), rel=1e-5)
    assert step.captures == 1
    assert traced_model.strides[0] == eager.strides[0] == (128, 8, 16, 1)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name].cpu(), value, rtol=1e-5, atol=1e-6)


def test_is_compiling_inside_the_step_only(backend):
    seen = []

    @cstorch.trace
    def step(x):
        seen.append(torch.compiler.is_compiling())
        return x * 2

    torch.testing.assert_close(torch.as_tensor(step(torch.ones(3))), torch.full((3,), 2.0))
    assert seen == [True]
    assert not torch.compiler.is_compiling()


def test_one_traced_run_of_the_function():
    calls = []

    def fn(x, w):
        calls.append(1)
        w.mul_(2)
        return [w, (x * w).sum()]

    graph = bridge.capture(fn, [torch.zeros(3), torch.zeros(3)])
    assert len(calls) == 1
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert not any(getattr(t, "_schema", None) is not None and t._schema.is_mutable
                   for t in targets), targets
    w, x = torch.randn(3), torch.randn(3)
    new_w, total = graph(x, w.clone())
    torch.testing.assert_close(new_w, w * 2)
    torch.testing.assert_close(total, (x * w * 2).sum())


def test_node_values_are_the_shapes_each_op_computes():
    """The capture keeps each op's own fake tensor as its node's `val` (no detached copy):
    after in-place updates, views and a backward pass, every node's `val` still has the
    shape, strides and dtype that running the graph on real tensors gives."""
    def fn(x, w):
        h = (x @ w).relu_()
        scaled = h.clone()
        scaled.transpose(0, 1)[:, 1:].mul_(3)
        loss = (scaled.view(-1)[::2] * h[:, 0]).sum()
        loss.backward()
        w.t()[:, 1:].add_(scaled.sum(0, keepdim=True))
        return [w, loss, x.grad]

    eager_x = torch.randn(4, 3, requires_grad=True)
    fn(eager_x, torch.randn(3, 2))   # a valid step in eager PyTorch
    graph = bridge.capture(fn, [torch.zeros(4, 3), torch.zeros(3, 2)], [True, False])
    ran = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            ran[node] = out = super().run_node(node)
            return out

    Recorder(graph).run(torch.randn(4, 3), torch.randn(3, 2))
    checked = 0
    for node, out in ran.items():
        val = node.meta.get("val")
        if node.op == "call_function" and isinstance(out, torch.Tensor):
            assert (val.shape, val.stride(), val.dtype) == (out.shape, out.stride(), out.dtype), \
                node.format_node()
            checked += 1
    assert checked > 10


def test_a_capture_leaves_make_fx_as_torch_has_it():
    """What the capture leaves out of node metadata, it leaves out only while it traces,
    also when the step raises: make_fx used afterwards records torch's `tensor_meta`."""
    own = proxy_tensor.snapshot_fake, proxy_tensor._extract_tensor_metadata

    def fails(x):
        raise ValueError("the step's own error")

    bridge.capture(lambda x: [x * 2], [torch.zeros(2)])
    with pytest.raises(ValueError, match="own error"):
        bridge.capture(fails, [torch.zeros(2)])
    assert (proxy_tensor.snapshot_fake, proxy_tensor._extract_tensor_metadata) == own
    traced = proxy_tensor.make_fx(lambda x: x * 2, tracing_mode="fake")(torch.zeros(2))
    (mul,) = [n for n in traced.graph.nodes if n.op == "call_function"]
    assert mul.meta["tensor_meta"].shape == torch.Size([2])


def _kernel_strides_audit(monkeypatch):
    """Wrap every decomposition so that it also runs the op's own fake kernel and records
    the ops whose decomposed outputs have other strides than the kernel's."""
    import sys
    import torch.utils._pytree as pytree
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    capture_module = sys.modules["bridge.capture"]
    table, mismatched = capture_module.decompositions(), {}

    def checked(op, decomposition):
        def run(*args, **kwargs):
            out = decomposition(*args, **kwargs)
            with disable_proxy_modes_tracing():
                kernel = op(*args, **kwargs)
            # Flash attention's decomposition returns the attention weights where the
            # kernel returns logsumexp, which no user code sees: only like shapes compare.
            for got, want in zip(pytree.tree_leaves(out), pytree.tree_leaves(kernel)):
                if (isinstance(got, torch.Tensor) and got.shape == want.shape
                        and got.dim() > 1 and got.numel() > 1
                        and got.stride() != want.stride()):
                    mismatched[str(op)] = (tuple(got.shape), got.stride(), want.stride())
            return out
        return run

    wrapped = {op: checked(op, fn) for op, fn in table.items()}
    monkeypatch.setattr(capture_module, "decompositions", lambda: wrapped)
    return mismatched


@pytest.mark.parametrize("batch_first", [True, False])
def test_decomposed_ops_keep_the_kernels_strides(backend, monkeypatch, batch_first):
    mismatched = _kernel_strides_audit(monkeypatch)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first,
                                       norm_first=True)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1))
    modules = nn.ModuleList([layer, conv, HeadsMergedWithView()])
    model = cstorch.compile(modules)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, image, tokens):
        loss = (modules[0](x).square().mean() + modules[1](image).mean()
                + modules[2](tokens).square().mean())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step(torch.randn(2, 5, 8), torch.randn(2, 3, 6, 6), torch.randn(2, 8, 16))
    assert step.captures == 1
    assert not mismatched, mismatched


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x) * 2


_STACK_TRACE_SCRIPT = r"""
import sys
import torch
import bridge
from test_capture_pass import _Scaled
model = _Scaled().requires_grad_(False)
graph = bridge.capture(lambda x: [model(x)], [torch.zeros(4, 3)])
traces = {n.target.__name__: n.meta.get("stack_trace", "") for n in graph.graph.nodes
          if n.op == "call_function" and hasattr(n.target, "__name__")}
print(repr((traces, "torch._inductor.sizevars" in sys.modules)))
"""


def test_stack_traces_keep_module_frames_and_skip_torch_machinery():
    # In a fresh process: the frames are filtered without importing what torch's own
    # list of uninteresting files imports (torch._inductor, torch.export).
    import ast
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(here)),
                                                         here])}
    out = subprocess.run([sys.executable, "-c", _STACK_TRACE_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    traces, inductor_loaded = ast.literal_eval(out.strip().splitlines()[-1])
    assert not inductor_loaded
    mul = traces["mul.Tensor"]
    assert "test_capture_pass.py" in mul and "return self.linear(x) * 2" in mul
    addmm = traces["addmm.default"]
    assert os.path.join("nn", "modules", "linear.py") in addmm and "in forward" in addmm
    assert os.path.join("torch", "fx") not in addmm and "_symbolic_trace" not in addmm


def test_every_file_torch_calls_uninteresting_is_skipped():
    from torch.fx.experimental.symbolic_shapes import uninteresting_files
    from bridge.user_line import machinery
    assert [f for f in uninteresting_files() if not machinery(f)] == []
    assert not machinery(torch.nn.modules.linear.__file__)
    assert not machinery(__file__)


def test_nodes_without_a_user_frame_cost_no_stack_extraction(monkeypatch):
    # make_fx extracts and symbolises the whole Python stack for every node that has no
    # trace yet (graph inputs, ops of a step defined in `python -c` or exec'd code, whose
    # frames are `<string>`), and finds nothing to keep: gpt-small's capture took 0.5 s
    # longer from `python -c` than from a file.
    from torch.utils._traceback import CapturedTraceback
    extracted = []
    original = CapturedTraceback.extract
    monkeypatch.setattr(CapturedTraceback, "extract",
                        staticmethod(lambda *a, **k: extracted.append(1) or original(*a, **k)))
    model = _Scaled().requires_grad_(False)
    namespace = {"model": model}
    exec(compile("def step(x, y):\n    return [model(x) - y.exp()]\n", "<string>", "exec"),
         namespace)
    graph = bridge.capture(namespace["step"], [torch.zeros(4, 3), torch.zeros(4, 2)])
    assert extracted == []
    traces = {n.target.__name__: n.meta.get("stack_trace")
              for n in graph.graph.nodes if n.op == "call_function"}
    assert "return self.linear(x) * 2" in traces["mul.Tensor"]   # the module's frame
    assert traces["exp.default"] is None   # no frame of the user's: as make_fx leaves it
    assert all(n.meta.get("stack_trace") is None
               for n in graph.graph.nodes if n.op == "placeholder")
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    torch.testing.assert_close(graph(x, y)[0], model(x) - y.exp())


def test_vmap_inside_the_step_over_a_closed_over_tensor():
    """transformers 4.x builds attention masks with nested `torch.vmap` over index
    tensors, one of them a real tensor the code closed over: inside vmap the traced
    tensors arrive wrapped by functorch, and must not be taken for real ones."""
    torch.manual_seed(0)
    offsets = torch.randn(5)          # real, closed over

    def mask(b, q, k):
        return (k <= q) * offsets[k] + b

    batched = torch.vmap(torch.vmap(torch.vmap(mask, (None, None, 0)), (None, 0, None)),
                         (0, None, None))

    def fn(bias, q_idx):
        return [batched(bias, q_idx, torch.arange(5))]

    bias, q_idx = torch.randn(3), torch.arange(4)
    gm = bridge.capture(fn, [bias, q_idx])
    got = bridge.lower(gm)(bridge.tensor_to_jax(bias), bridge.tensor_to_jax(q_idx))[0]
    want = fn(bias, q_idx)[0]
    assert want.shape == (3, 4, 5)
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, rtol=1e-6, atol=0)
