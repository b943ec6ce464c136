"""Precision optimization levels on the CSX backend: what each computes in, pinned against
PyTorch computing the same roundings."""
import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch


@pytest.fixture
def level():
    flags = cstorch.backends.csx.precision
    yield flags
    flags.reset()


def _bf16(t):
    return t.bfloat16().float()


def _forward(pol, backend_type="CSX"):
    torch.manual_seed(0)
    model = nn.Linear(64, 48)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    cstorch.backends.csx.precision.optimization_level = pol
    cstorch.backend(backend_type)
    compiled = cstorch.compile(model)

    @cstorch.trace
    @torch.no_grad()
    def step(x):
        return compiled(x)

    return step(x).host(), model, x, step


def test_level_0_is_float32(level):
    out, model, x, _ = _forward(0)
    w, b = model.weight.host(), model.bias.host()
    assert torch.allclose(out, x @ w.T + b, rtol=1e-6, atol=1e-6)


def test_level_1_rounds_operands_to_bfloat16_and_keeps_float32_results(level):
    out, model, x, step = _forward(1)
    w, b = model.weight.host(), model.bias.host()
    expected = _bf16(x) @ _bf16(w).T + b
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out, x @ w.T + b, rtol=1e-5, atol=1e-5)   # not float32
    jaxpr = str(step.to_jax(x).jaxpr())
    assert "bf16" in jaxpr and "preferred_element_type=float32" in jaxpr


def test_level_2_also_rounds_the_products(level):
    out, model, x, _ = _forward(2)
    w, b = model.weight.host(), model.bias.host()
    expected = _bf16(_bf16(x) @ _bf16(w).T) + b
    # float32 accumulation order may put a product on the other side of a bfloat16
    # rounding boundary: at most one bfloat16 step apart, and rarely
    close = torch.isclose(out, expected, rtol=1e-6, atol=1e-6)
    assert close.float().mean() > 0.99
    step = (expected - b).abs() * 2 ** -7
    assert ((out - expected).abs() <= step + 1e-6).all()
    level1 = _bf16(x) @ _bf16(w).T + b
    assert not torch.allclose(out, level1, rtol=1e-5, atol=1e-5)


def test_levels_change_the_program_and_only_csx_uses_them(level):
    out1, _, x, step = _forward(1)
    cstorch.backends.csx.precision.optimization_level = 0
    assert not torch.equal(step(x).host(), out1)     # a new level: a new program
    assert step.captures == 2
    exact, model, x, _ = _forward(2, backend_type="CPU")   # POL is a CSX flag
    assert torch.allclose(exact, x @ model.weight.host().T + model.bias.host(), rtol=1e-6, atol=1e-6)


def test_convolutions_follow_the_level(level):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 10, 10)
    expected = nn.functional.conv2d(_bf16(x), _bf16(conv.weight.detach()), conv.bias.detach())
    cstorch.backends.csx.precision.optimization_level = 1
    cstorch.backend("CSX")
    compiled = cstorch.compile(conv)

    @cstorch.trace
    @torch.no_grad()
    def step(x):
        return compiled(x)

    assert torch.allclose(step(x).host(), expected, rtol=1e-5, atol=1e-5)
