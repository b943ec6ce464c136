"""One OpInfo sample input, captured, lowered, run under `jax.jit` and held against eager.

Forward: the sample's tensors become graph inputs (everything else is baked in) and the
op's outputs are compared. Backward: the step computes the op, a scalar loss
sum_i <output_i, cotangent_i> with fixed random cotangents (all-ones would hide errors:
the gradient of sum(softmax(x)) is zero whatever the backward does), calls `backward()`
and returns the inputs' `.grad`; every input gradient is compared. A gradient whose
values miss the tolerance is then held, with eager's, to eager's gradient in float64
(PyTorch's TestDecomp criterion): it passes when its largest error is no larger than
eager's own float32 one.

Each runner returns (outcome, detail):
- pass     the JAX result matches eager within the dtype's tolerance
- fail     capture succeeded but lowering, JAX tracing or the comparison failed, or a
           lowering is missing
- refused  PyTorch's own tracer produced no graph (data-dependent shapes, `.item()`,
           ...), or a lowering raised `DataDependentShapeError` (an output shape that
           depends on values)
- skip     nothing to compare: a complex or sparse input, eager raised, no output (or,
           backward, no input) that takes part in autograd
A sample is random when its captured graph draws random numbers (an op tagged
`nondeterministic_seeded`: dropout in training, fractional max pooling's draw, ...); its
values are then not compared, only shapes and dtypes (and, backward, which inputs get a
gradient). Eager cannot tell: OpInfo wraps random ops to reseed on every call.
"""
import jax
import torch
from torch.utils import _pytree as pytree

import bridge
from bridge.convert import tensor_to_jax
from bridge.errors import DataDependentShapeError
from tools.conformance.compare import (COMPARE_RULES, UNDEFINED_VALUES, as_eager, compare,
                                       compare_to_reference, tensors_of)


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _first_line(e: BaseException, limit=200) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit] if lines else ''}"


def _failure(e: BaseException) -> tuple[str, str]:
    if isinstance(e, DataDependentShapeError):
        # Traced, but the lowering has no static output shape for it: as good as a refusal.
        return "refused", f"lowering: {_first_line(e)}"
    msg = str(e).strip().splitlines()
    return "fail", f"{type(e).__name__}: {' | '.join(msg[:3])[:300] if msg else ''}"


class _Sample:
    """A sample's tensors pulled out of its (input, args, kwargs), and a call that puts
    other tensors in their places."""

    def __init__(self, sample):
        self.leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        self.where = [i for i, v in enumerate(self.leaves) if isinstance(v, torch.Tensor)]
        self.tensors = [self.leaves[i] for i in self.where]

    def unusable(self) -> bool:
        return any(t.is_complex() or t.layout != torch.strided for t in self.tensors)

    def call(self, fn, tensors):
        filled = list(self.leaves)
        for i, t in zip(self.where, tensors):
            filled[i] = t
        inp, args, kwargs = pytree.tree_unflatten(filled, self.spec)
        return fn(inp, *args, **kwargs)


def _random(op, gm) -> bool:
    return op.name in UNDEFINED_VALUES or any(
        n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
        for n in gm.graph.nodes)


def run_forward(op, sample) -> tuple[str, str]:
    s = _Sample(sample)
    if s.unusable():
        return "skip", "complex or sparse input"
    inputs = [t.detach().clone() for t in s.tensors]

    def eager():
        return tensors_of(s.call(op, [t.clone() for t in inputs]))

    try:
        expected = eager()
    except Exception as e:
        return "skip", f"eager raised {type(e).__name__}"
    if not expected or any(e.is_complex() or e.layout != torch.strided for e in expected):
        return "skip", "no real dense tensor output"

    try:
        gm = bridge.capture(lambda *ts: tensors_of(s.call(op, ts)), inputs)
    except bridge.LoweringError as e:
        return "fail", f"LoweringError: {str(e).splitlines()[0]}"
    except Exception as e:
        return "refused", f"capture: {_first_line(e)}"
    random = _random(op, gm)
    try:
        outs = jax.jit(bridge.lower(gm))(*[tensor_to_jax(t) for t in inputs],
                                         key=jax.random.key(0))
        if len(outs) != len(expected):
            raise AssertionError(f"{len(outs)} outputs != eager {len(expected)}")
        got = [as_eager(o, e) for o, e in zip(outs, expected)]
        rule = COMPARE_RULES.get(entry_name(op))
        if rule is not None and not random:
            expected, got = rule(expected), rule(got)
        for e, g in zip(expected, got):
            compare(e, g, values=not random)
    except Exception as e:
        return _failure(e)
    return "pass", ""


def _cotangents(outputs):
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.dtype) for o in outputs]


def run_backward(op, sample) -> tuple[str, str]:
    s = _Sample(sample)
    if s.unusable():
        return "skip", "complex or sparse input"
    flags = [t.requires_grad for t in s.tensors]
    if not any(flags):
        return "skip", "no input requires grad"
    inputs = [t.detach().clone() for t in s.tensors]
    fn = op.get_op()

    def differentiable_outputs(ts):
        # OpInfo's own gradient tests go through gradcheck_wrapper (it makes, say, the
        # input of a Hermitian solver Hermitian) and output_process_fn_grad (it keeps
        # the unique part of non-unique results such as singular vectors).
        out = s.call(lambda *a, **k: op.gradcheck_wrapper(fn, *a, **k), ts)
        return [o for o in tensors_of(sample.output_process_fn_grad(out))
                if o.requires_grad and (o.is_floating_point() or o.is_complex())]

    def gradients(ts, outs, cotangents):
        if len(outs) != len(cotangents):
            raise AssertionError(f"{len(outs)} differentiable outputs != eager {len(cotangents)}")
        sum((o * c).sum() for o, c in zip(outs, cotangents)).backward()
        return [t.grad for t, f in zip(ts, flags) if f]

    try:
        ts = [t.clone().requires_grad_(f) for t, f in zip(inputs, flags)]
        outs = differentiable_outputs(ts)
        cotangents = _cotangents([o.detach() for o in outs])
        if not cotangents:
            return "skip", "no differentiable output"
        expected = gradients(ts, outs, cotangents)
    except Exception as e:
        return "skip", f"eager raised {type(e).__name__}"
    has_grad = [g is not None for g in expected]
    if not any(has_grad):
        return "skip", "no input gets a gradient"

    def float64_gradients():
        """Eager's gradients computed in float64, as PyTorch's TestDecomp does to judge
        a decomposition that disagrees with float32 eager."""
        ts = [t.double().requires_grad_(f) if t.is_floating_point() else t.clone()
              for t, f in zip(inputs, flags)]
        grads = gradients(ts, differentiable_outputs(ts), [c.double() for c in cotangents])
        return [g for g in grads if g is not None]

    n = len(inputs)
    graph_has_grad = []

    def captured(*ts):
        grads = gradients(ts[:n], differentiable_outputs(ts[:n]), ts[n:])
        graph_has_grad[:] = [g is not None for g in grads]
        return [g for g in grads if g is not None]

    try:
        gm = bridge.capture(captured, inputs + cotangents, flags + [False] * len(cotangents))
    except bridge.LoweringError as e:
        return "fail", f"LoweringError: {str(e).splitlines()[0]}"
    except Exception as e:
        return "refused", f"capture: {_first_line(e)}"
    random = _random(op, gm)
    try:
        if graph_has_grad != has_grad:
            raise AssertionError(f"inputs with a gradient {graph_has_grad} != eager {has_grad}")
        got = jax.jit(bridge.lower(gm))(*[tensor_to_jax(t) for t in inputs + cotangents],
                                        key=jax.random.key(0))
        want = [g for g in expected if g is not None]
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} gradients != eager {len(want)}")
        reference = []
        for k, (e, g) in enumerate(zip(want, got)):
            g = as_eager(g, e)
            compare(e, g, values=False)
            if random:
                continue
            try:
                compare(e, g)
            except AssertionError as mismatch:
                # eager's own float32 error can exceed the tolerance: hold both to float64
                if not e.is_floating_point():
                    raise
                try:
                    reference = reference or float64_gradients()
                except Exception:
                    raise mismatch from None
                if len(reference) != len(want):
                    raise mismatch
                compare_to_reference(e, g, reference[k])
    except Exception as e:
        return _failure(e)
    return "pass", ""
