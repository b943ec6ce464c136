"""Hand-written lowerings checked where the OpInfo run cannot: fixed random draws, wide
argument ranges."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bridge.ops import bessel
from bridge.ops.pooling import fractional_max_pool


@pytest.mark.parametrize("shape,kernel,out", [
    ((2, 3, 11, 9), [2, 3], [5, 4]), ((3, 7, 7), [2, 2], [3, 1]),
    ((2, 2, 7, 8, 9), [2, 2, 3], [3, 4, 5])])
def test_fractional_max_pool_matches_aten_for_given_samples(shape, kernel, out):
    # The conformance run draws the samples inside the op, so it compares shapes only;
    # with the draw passed in, values and indices must equal ATen's exactly.
    torch.manual_seed(0)
    nd = len(kernel)
    x = torch.randn(shape)
    samples = torch.rand(shape[0] if len(shape) == nd + 2 else 1, shape[-nd - 1], nd)
    op = torch.ops.aten.fractional_max_pool2d if nd == 2 else torch.ops.aten.fractional_max_pool3d
    want_values, want_indices = op(x, kernel, out, samples)
    values, indices = fractional_max_pool(jnp.asarray(x.numpy()), kernel, out,
                                          jnp.asarray(samples.numpy()))
    np.testing.assert_allclose(np.asarray(values), want_values.numpy())
    np.testing.assert_array_equal(np.asarray(indices), want_indices.numpy())


@pytest.mark.parametrize("name,fn", [
    ("bessel_j0", bessel._j0), ("bessel_j1", bessel._j1),
    ("bessel_y0", lambda x: bessel._y(0, x)), ("bessel_y1", lambda x: bessel._y(1, x)),
    ("modified_bessel_k0", lambda x: bessel._k(0, x)),
    ("modified_bessel_k1", lambda x: bessel._k(1, x)),
    ("scaled_modified_bessel_k0", lambda x: bessel._k_scaled(0, x)),
    ("scaled_modified_bessel_k1", lambda x: bessel._k_scaled(1, x)),
    ("airy_ai", bessel._airy_ai)])
def test_bessel_functions_over_a_wide_range(name, fn):
    # OpInfo samples only |x| < 10; the quadrature/asymptotic switch is at 25.
    x = torch.cat([torch.linspace(-60, 60, 1201), torch.tensor([0.0, 1e-6, 1e-3, 24.99, 25.01, 200.0])])
    want = getattr(torch.special, name)(x.double()).numpy()
    got = np.asarray(fn(jnp.asarray(x.numpy()))).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
