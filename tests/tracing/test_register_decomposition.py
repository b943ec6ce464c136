"""`cstorch.register_decomposition(op, device)`: a user's rule replaces an op in the steps
captured on that kind of backend, and only there."""
import pytest
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cstorch import decompositions
from cstorch.backend.types import BackendType


@pytest.fixture
def tables(monkeypatch):
    monkeypatch.setattr(decompositions, "_TABLES", {t: {} for t in BackendType})


def _tanh_gelu(x, approximate="none"):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def _step():
    @cstorch.trace
    def step(x):
        return F.gelu(x) * 3
    return step


@pytest.mark.parametrize("registered_for, applies", [("CPU", True), ("CSX", False)])
def test_a_registered_rule_replaces_the_op_on_its_backend(tables, registered_for, applies):
    assert cstorch.register_decomposition(torch.ops.aten.gelu, device=registered_for)(
        _tanh_gelu) is _tanh_gelu
    cstorch.backend("CPU")
    x = torch.linspace(-3, 3, 50)
    got = _step()(x)
    exact, approx = F.gelu(x) * 3, F.gelu(x, approximate="tanh") * 3
    assert not torch.allclose(exact, approx, rtol=0, atol=1e-5)   # the two rules differ
    torch.testing.assert_close(got.host(), approx if applies else exact, rtol=1e-4, atol=1e-6)


def test_register_decomposition_errors(tables):
    with pytest.raises(TypeError, match="ATen op"):
        cstorch.register_decomposition(F.gelu)
    with pytest.raises(ValueError, match="unknown backend type"):
        cstorch.register_decomposition(torch.ops.aten.gelu.default, device="TPU")
    with pytest.raises(TypeError, match="callable"):
        cstorch.register_decomposition(torch.ops.aten.gelu.default)(3)
    assert decompositions.table_for("CSX") == {}
