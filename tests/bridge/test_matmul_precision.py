"""Every matrix product and convolution of a lowered graph is asked for at JAX's highest
precision. Left at the default, XLA computes a float32 product in TF32 on recent NVIDIA
GPUs (a relative error near 1e-3; the OpInfo run on an H200 found
`_upsample_bilinear2d_aa` and `linalg.pinv` off this way), while on a CPU the default is
float32 already, so values compared here could not show it: the programs are inspected."""
import jax
import jax.extend.core
import pytest
import torch
import torch.nn.functional as F

import bridge
from test_backward_lowerings import _randn

_PRODUCTS = ("dot_general", "conv_general_dilated")


def _products(jaxpr):
    """(primitive name, precision) of every product in `jaxpr` and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _PRODUCTS:
            yield eqn.primitive.name, eqn.params["precision"]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _products(sub)


def _lstm(x):
    torch.manual_seed(0)
    out, _ = torch.nn.LSTM(8, 6, num_layers=2)(x)
    return out


CASES = {
    # lowerings that compute their products with jnp's `@` or einsum
    "upsample_bilinear2d_aa": (lambda x: F.interpolate(x, size=(5, 3), mode="bilinear",
                                                       antialias=True), (2, 3, 9, 7)),
    "linalg.pinv": (torch.linalg.pinv, (4, 5)),
    "lstm": (_lstm, (7, 3, 8)),
    "addmv": (lambda m: torch.addmv(m[:, 0], m, m[0]), (6, 6)),
    # products lowered through bridge.precision keep their explicit precision
    "matmul": (lambda a: a @ a.T, (4, 5)),
    "conv2d": (lambda x: F.conv2d(x, x[:2, :, :2, :2]), (3, 3, 6, 6)),
}


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("name", CASES)
def test_every_product_is_float32(name, backward):
    fn, shape = CASES[name]
    x = _randn(*shape)
    if backward:
        def step(x):
            x.requires_grad_(True)
            y = fn(x)
            (y * y).sum().backward()
            return [x.grad]
        graph = bridge.capture(step, [x])
    else:
        graph = bridge.capture(lambda x: [fn(x)], [x])
    closed = jax.make_jaxpr(bridge.lower(graph))(bridge.tensor_to_jax(x))
    products = list(_products(closed.jaxpr))
    assert products, "the program holds no product to check"
    highest = (jax.lax.Precision.HIGHEST,) * 2
    assert [p for p in products if p[1] != highest] == []
