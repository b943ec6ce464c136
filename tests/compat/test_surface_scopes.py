"""cstorch.name_scope, cstorch.pol / current_pol, make_constant, add_debug_name /
get_debug_name and _generating_docs."""
import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch


@pytest.fixture
def flags():
    yield cstorch.backends.csx.precision
    cstorch.backends.csx.precision.reset()


def _bf16(t):
    return t.bfloat16().float()


def test_name_scopes_name_the_ops_of_the_lowered_step():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Linear(4, 3)
    compiled = cstorch.compile(model)
    scope = cstorch.name_scope("grad_norm")

    @cstorch.trace
    @torch.no_grad()
    def step(x):
        with cstorch.name_scope("params_norm"):
            with cstorch.name_scope("inner/part"):
                assert cstorch.core.current_name_scope() == "params_norm/inner|part"
                norm = torch.norm(compiled(x))
        scope.__enter__()              # entered and left by hand, as Model Zoo's scheduler callback does
        doubled = norm * 2
        scope.__exit__(None, None, None)
        return norm, doubled

    x = torch.randn(2, 4)
    hlo = step.to_jax(x).stablehlo()
    assert "params_norm/inner|part/aten.addmm.default" in hlo
    assert "grad_norm/aten.mul.Tensor" in hlo
    assert "params_norm/aten.mul" not in hlo
    norm, doubled = step(x)
    expected = torch.norm(x @ model.weight.host().T + model.bias.host())
    assert torch.allclose(norm.host(), expected, rtol=1e-6)
    assert torch.allclose(doubled.host(), 2 * expected, rtol=1e-6)
    assert cstorch.core.current_name_scope() == ""
    with pytest.raises(ValueError):
        cstorch.name_scope("")


def test_pol_scopes_set_the_forward_and_backward_levels_on_csx(flags):
    torch.manual_seed(0)
    flags.optimization_level = 1
    cstorch.backend("CSX")
    model = nn.Linear(64, 48)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.0)
    w, b = model.weight.host(), model.bias.host()
    x, gy = torch.randn(32, 64), torch.randn(32, 48)
    levels = {}

    @cstorch.trace
    def step(x, gy):
        optimizer.zero_grad()
        levels["outside"] = cstorch.current_pol()
        exact = cstorch.pol(level=0)(compiled)(x)          # forward at level 0
        with cstorch.pol(bwd_level=0):                      # forward as the backend, backward at 0
            levels["inside"] = cstorch.current_pol()
            y = compiled(x)
        (y * gy).sum().backward()
        return exact, y, model.weight.grad

    exact, y, grad = [t.host() for t in step(x, gy)]
    assert levels == {"outside": 1, "inside": 1}
    assert torch.allclose(exact, x @ w.T + b, rtol=1e-6, atol=1e-6)            # float32
    assert torch.allclose(y, _bf16(x) @ _bf16(w).T + b, rtol=1e-6, atol=1e-6)  # level 1
    assert not torch.allclose(y, exact, rtol=1e-5, atol=1e-5)
    assert torch.allclose(grad, gy.T @ x, rtol=1e-5, atol=1e-5)                # backward at 0
    assert not torch.allclose(grad, _bf16(gy).T @ _bf16(x), rtol=1e-6, atol=1e-6)


def test_current_pol_follows_scopes_and_the_backend(flags):
    cstorch.backend("CPU")
    assert cstorch.current_pol() == 0             # CPU computes in float32
    with cstorch.pol(level=2, bwd_level=0):
        assert cstorch.current_pol() == 2
        with cstorch.pol(bwd_level=1):
            assert cstorch.current_pol() == 2
        with cstorch.pol(level=0):
            assert cstorch.current_pol() == 0
    flags.optimization_level = 2
    cstorch.backend("CSX")
    assert cstorch.current_pol() == 2
    wrapped = cstorch.pol(level=0)(lambda: cstorch.current_pol())
    assert wrapped() == 0 and cstorch.current_pol() == 2
    for bad in (3, -1, 1.0, True):
        with pytest.raises(ValueError):
            cstorch.pol(level=bad)
    with pytest.raises(TypeError):
        cstorch.pol()(5)


def test_make_constant_keeps_values_and_cuts_gradients():
    x = torch.randn(3, requires_grad=True)
    c = cstorch.make_constant(x * 2)
    assert torch.equal(c, (x * 2).detach()) and not c.requires_grad
    assert torch.equal(cstorch.make_constant([1, 2]), torch.tensor([1, 2]))
    cstorch.backend("CPU")

    @cstorch.trace
    @torch.no_grad()
    def step(pos):
        inv = cstorch.make_constant(1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)))
        return torch.outer(pos, inv).sin()

    pos = torch.arange(5.0)
    expected = torch.outer(pos, 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))).sin()
    assert torch.allclose(step(pos).host(), expected, rtol=1e-6, atol=1e-6)


def test_debug_names_are_module_paths():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 1)))
    assert cstorch.get_debug_name(model[0]) == "Linear"       # not named yet
    assert cstorch.add_debug_name(model) is model
    assert cstorch.get_debug_name(model) == "model"
    assert cstorch.get_debug_name(model[0]) == "model.0"
    assert cstorch.get_debug_name(model[1][1]) == "model.1.1"
    cstorch.add_debug_name(model[1], root_name="head")
    assert cstorch.get_debug_name(model[1][0]) == "head.0"
    assert "_cstorch_debug_name" not in model.state_dict()
    assert cstorch._generating_docs is False
