"""Lowerings rewritten into forms XLA's CPU code runs faster (issue 13): the exact GELU in
ATen's erf form with its analytic derivative, and a scatter of one entry per row as a
one-hot comparison. Values and gradients against eager PyTorch; the scatter's program
must hold no scatter."""
import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge
from test_backward_lowerings import _check, _randn

aten = torch.ops.aten


def test_exact_gelu_is_lowered_in_the_erf_form():
    x = _randn(4, 8)
    graph = bridge.capture(lambda a, g: [F.gelu(a), aten.gelu_backward(g, a)], [x, x])
    jaxpr = str(jax.make_jaxpr(bridge.lower(graph))(*[bridge.tensor_to_jax(x)] * 2))
    assert " erf " in jaxpr and "erfc" not in jaxpr


def test_exact_gelu_and_its_gradient_float32():
    # wide enough that the tails (gelu exactly 0 in float32 below about -5.4) are covered
    x = _randn(8, 16, 64) * 4
    _check(lambda v: F.gelu(v), [x], [True])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_gelu_half_computes_in_float32(dtype):
    x = (_randn(4, 64) * 3).to(dtype)
    g = _randn(4, 64, seed=5).to(dtype)
    graph = bridge.capture(lambda a, b: [F.gelu(a), aten.gelu_backward(b, a)], [x, g])
    got = jax.jit(bridge.lower(graph))(bridge.tensor_to_jax(x), bridge.tensor_to_jax(g))
    want = [F.gelu(x), aten.gelu_backward(g, x)]
    for ours, theirs in zip(got, want):
        assert ours.dtype == bridge.to_jax_dtype(dtype)
        np.testing.assert_allclose(np.asarray(ours.astype(np.float32)), theirs.float().numpy(),
                                   rtol=1e-2, atol=1e-2)


def _scatter_program(fn, inputs):
    graph = bridge.capture(fn, inputs)
    lowered = bridge.lower(graph)
    args = [bridge.tensor_to_jax(t) for t in inputs]
    return jax.jit(lowered)(*args), str(jax.make_jaxpr(lowered)(*args))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_one_entry_per_row_scatter_is_a_comparison(dim):
    x = _randn(6, 5)
    size = x.shape[dim]
    index_shape = [1, 5] if dim == 0 else [6, 1]
    index = torch.randint(0, size, index_shape, generator=torch.Generator().manual_seed(2))
    src = _randn(*index_shape, seed=3)
    fn = lambda a, i, s: [a.scatter(dim, i, -1.5), a.scatter(dim, i, s)]  # noqa: E731
    (by_value, by_src), jaxpr = _scatter_program(fn, [x, index, src])
    np.testing.assert_array_equal(np.asarray(by_value), x.scatter(dim, index, -1.5).numpy())
    np.testing.assert_array_equal(np.asarray(by_src), x.scatter(dim, index, src).numpy())
    assert "scatter" not in jaxpr


def test_other_scatters_keep_the_scatter():
    x = _randn(6, 5)
    index = torch.tensor([[0, 4], [2, 1], [3, 3]])   # fewer rows than x: not one per row
    src = _randn(3, 2, seed=4)
    (by_value, by_src), jaxpr = _scatter_program(
        lambda a, i, s: [a.scatter(1, i, 2.0), a.scatter(1, i, s)], [x, index, src])
    np.testing.assert_array_equal(np.asarray(by_value), x.scatter(1, index, 2.0).numpy())
    np.testing.assert_array_equal(np.asarray(by_src), x.scatter(1, index, src).numpy())
    assert "scatter" in jaxpr


def test_cross_entropy_gradient_through_the_dense_scatter():
    logits = _randn(16, 10)
    target = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(6))
    target[3] = -100   # ignored
    _check(lambda z: F.cross_entropy(z, target).reshape(1), [logits], [True])
