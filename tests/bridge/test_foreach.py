"""`aten._foreach_*` lowerings (bridge/ops/foreach.py): each foreach overload gives what
eager PyTorch gives, element by element, on lists of tensors of different shapes; a
captured foreach op stays one graph node."""
import jax
import numpy as np
import pytest
import torch

import bridge
from bridge.errors import CaptureError

aten = torch.ops.aten


def _lists(seed, count=2, positive=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), ()]
    out = []
    for _ in range(count):
        ts = [torch.randn(s, generator=g) for s in shapes]
        out.append([t.abs() + 0.5 for t in ts] if positive else ts)
    return out


def _run(fn, flat):
    graph = bridge.capture(fn, flat)
    got = jax.jit(bridge.lower(graph))(*[bridge.tensor_to_jax(t) for t in flat])
    return graph, [np.asarray(g) for g in got]


def _check(fn, lists, *extra):
    """`fn(*lists, *extra)` captured on the flattened lists against eager."""
    sizes = [len(xs) for xs in lists]
    flat = [t for xs in lists for t in xs] + list(extra)

    def flat_fn(*args):
        it = iter(args)
        groups = [[next(it) for _ in range(n)] for n in sizes]
        return list(fn(*groups, *list(it)))

    graph, got = _run(flat_fn, flat)
    want = flat_fn(*flat)
    assert len(got) == len(want)
    for ours, theirs in zip(got, want):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)
    return graph


UNARY = ["abs", "neg", "sqrt", "exp", "log", "sigmoid", "reciprocal", "sign", "rsqrt", "tanh",
         "floor", "erf"]


@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
    (xs,) = _lists(1, 1, positive=name in ("sqrt", "log", "rsqrt"))
    _check(lambda a: getattr(torch, f"_foreach_{name}")(a), [xs])


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum",
                                  "clamp_min", "clamp_max", "pow"])
def test_binary_list_scalar_and_scalar_list(name):
    xs, ys = _lists(2, positive=name == "pow")
    op = getattr(torch, f"_foreach_{name}")
    _check(lambda a, b: op(a, b), [xs, ys])                       # List
    if name not in ("maximum", "minimum"):
        _check(lambda a: op(a, 1.5), [xs])                        # Scalar
        _check(lambda a: op(a, [0.5, -2.0, 3.0]), [xs])           # ScalarList


@pytest.mark.parametrize("name", ["add", "mul", "div"])
def test_binary_with_one_tensor(name):
    # torch._foreach_add(list, tensor) reads the tensor as a number; the overload itself does not
    (xs,) = _lists(3, 1)
    op = getattr(aten, f"_foreach_{name}").Tensor
    _check(lambda a, t: op(a, t), [xs], torch.tensor(0.37))


def test_add_and_sub_take_alpha():
    xs, ys = _lists(4)
    _check(lambda a, b: torch._foreach_add(a, b, alpha=-0.25), [xs, ys])
    _check(lambda a, b: torch._foreach_sub(a, b, alpha=3.0), [xs, ys])
    _check(lambda a, t: aten._foreach_add.Tensor(a, t, alpha=2.0), [xs], torch.tensor(0.37))


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_ternary(name):
    xs, ys, zs = _lists(5, 3, positive=True)
    op = getattr(torch, f"_foreach_{name}")
    _check(lambda a, b, c: op(a, b, c), [xs, ys, zs])
    _check(lambda a, b, c: op(a, b, c, value=-0.3), [xs, ys, zs])
    _check(lambda a, b, c: op(a, b, c, [0.5, -1.0, 2.0]), [xs, ys, zs])


def test_lerp_norm_copy_and_a_broadcast_zero_d_list():
    xs, ys, ws = _lists(6, 3)
    _check(lambda a, b: torch._foreach_lerp(a, b, 0.3), [xs, ys])
    _check(lambda a, b, w: torch._foreach_lerp(a, b, w), [xs, ys, ws])
    _check(lambda a: torch._foreach_norm(a), [xs])
    _check(lambda a: torch._foreach_norm(a, 1), [xs])
    _check(lambda a, b: aten._foreach_copy.default(a, b), [xs, ys])
    # a list of one 0-d tensor per element, broadcast against each (a per-parameter step size)
    scalars = [torch.tensor(v) for v in (0.5, -1.5, 2.0)]
    _check(lambda a, s: torch._foreach_mul(a, s), [xs, scalars])


def test_in_place_foreach_is_one_node_and_updates_the_inputs():
    xs, ys = _lists(7)

    def fn(a, b):
        a = [t.clone() for t in a]
        torch._foreach_mul_(a, 0.9)
        torch._foreach_addcmul_(a, b, b, value=0.1)
        return a

    graph = _check(fn, [xs, ys])
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count(aten._foreach_mul.Scalar) == 1
    assert targets.count(aten._foreach_addcmul.Scalar) == 1
    assert aten.mul.Tensor not in targets


def test_write_into_a_closed_over_tensor_by_a_foreach_op_is_refused():
    outside = [torch.zeros(3), torch.zeros(2)]

    def fn(x):
        torch._foreach_add_(outside, 1.0)
        return [x + 1]

    with pytest.raises(CaptureError, match="writes in place"):
        bridge.capture(fn, [torch.zeros(2)])
