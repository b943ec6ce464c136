"""`cstorch.optim.Muon` does what Muon is documented to do (momentum, Nesterov look-ahead,
Newton-Schulz orthogonalisation of the update of each weight matrix, decoupled weight
decay), checked against an independent float64 computation of that update. The real
package's step raises on the CPU backend (behaviour.json records the TypeError); here it
steps, and refuses parameters with no matrix to orthogonalise."""
import json
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.conftest import SHARED

with open(os.path.join(SHARED, "fixtures", "behaviour.json")) as f:
    SCENARIO = json.load(f)["scenarios"]["optimizers"]


def newton_schulz(g, steps):
    """The quintic iteration written out: X <- a X + b (X X^T) X + c (X X^T)^2 X."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (torch.linalg.matrix_norm(g) + 1e-7)
    transpose = g.shape[0] > g.shape[1]
    if transpose:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + b * (s @ x) + c * (s @ (s @ x))
    return x.T if transpose else x


def reference(p, grads, lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True, ns_steps=5):
    """The documented update, in float64, one parameter."""
    p = p.double().clone()
    buf = torch.zeros_like(p)
    for g in grads:
        g = g.double()
        buf = torch.lerp(buf, g, 1 - momentum)
        u = torch.lerp(g, buf, momentum) if nesterov else buf
        m = u.reshape(u.shape[0], -1)
        o = newton_schulz(m, ns_steps).reshape(p.shape)
        p = p * (1 - lr * weight_decay) - lr * max(1, m.shape[0] / m.shape[1]) ** 0.5 * o
    return p, buf


def close(actual, expected, rtol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=1e-7)


def recorded_grads(step):
    return torch.tensor(SCENARIO["inputs"]["grads"][str(step)]["p0"]).reshape(3, 4)


def test_default_muon_on_the_scenarios_matrix_follows_the_documented_update():
    cstorch.backend("CPU")
    p0 = torch.tensor(SCENARIO["inputs"]["p0_init"]).reshape(3, 4)
    param = torch.nn.Parameter(p0.clone())
    opt = cstorch.optim.Muon([param])
    grads = [recorded_grads(s) for s in range(1, 6)]
    for g in grads:
        param.grad = g.clone()
        opt.step()
    want, buf = reference(p0, grads)
    close(param.detach(), want)
    close(opt.state[param]["momentum_buffer"], buf)
    assert list(opt.state_dict()["state"][0]) == ["momentum_buffer"]


@pytest.mark.parametrize("shape", [(6, 3), (3, 7), (4, 2, 3, 3)], ids=["tall", "wide", "conv"])
@pytest.mark.parametrize("kwargs", [
    dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True, ns_steps=5),
    dict(lr=0.01, weight_decay=0.0, momentum=0.8, nesterov=False, ns_steps=3),
], ids=["nesterov", "plain"])
def test_muon_follows_the_documented_update(shape, kwargs):
    cstorch.backend("CPU")
    g = torch.Generator().manual_seed(1)
    init = torch.randn(*shape, generator=g)
    grads = [torch.randn(*shape, generator=g) for _ in range(4)]
    param = torch.nn.Parameter(init.clone())
    opt = cstorch.optim.Muon([param], **kwargs)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    want, buf = reference(init, grads, **kwargs)
    close(param.detach(), want)
    close(opt.state[param]["momentum_buffer"], buf)


def test_the_update_is_nearly_orthogonal():
    """What Muon is for: the step's direction has all singular values near 1."""
    cstorch.backend("CPU")
    param = torch.nn.Parameter(torch.zeros(8, 5))
    opt = cstorch.optim.Muon([param], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False)
    param.grad = torch.randn(8, 5, generator=torch.Generator().manual_seed(2))
    opt.step()
    singular = torch.linalg.svdvals(-param.detach() / (8 / 5) ** 0.5)
    assert singular.min() > 0.6 and singular.max() < 1.25, singular


def test_a_vector_parameter_is_refused_before_anything_moves():
    """The scenario's Muon([p0, p1]): the real package raises a TypeError at the first step
    (its bug) and leaves the state as recorded; here the error names the parameter."""
    cstorch.backend("CPU")
    case = SCENARIO["cases"]["Muon"]
    inputs = SCENARIO["inputs"]
    p0 = torch.nn.Parameter(torch.tensor(inputs["p0_init"]).reshape(3, 4))
    p1 = torch.nn.Parameter(torch.tensor(inputs["p1_init"]))
    opt = cstorch.optim.Muon([p0, p1])
    before = p0.detach().clone()
    p0.grad = recorded_grads(1)
    p1.grad = torch.tensor(inputs["grads"]["1"]["p1"])
    with pytest.raises(ValueError, match=r"shape \(4,\) has fewer than 2 dimensions"):
        opt.step()
    assert torch.equal(p0.detach(), before)
    sd = opt.state_dict()
    want = case["state_dict"]
    for i in ("0", "1"):
        rec = want["state"][i]["momentum_buffer"]
        assert sd["state"][int(i)]["momentum_buffer"].flatten().tolist() == rec["values"]
    assert json.loads(json.dumps(sd["param_groups"])) == want["param_groups"]


def test_a_vector_without_a_gradient_is_left_alone():
    cstorch.backend("CPU")
    matrix = torch.nn.Parameter(torch.ones(3, 4))
    bias = torch.nn.Parameter(torch.ones(4))
    opt = cstorch.optim.Muon([matrix, bias])
    matrix.grad = torch.ones(3, 4)
    opt.step()
    assert torch.equal(bias.detach(), torch.ones(4))
    assert not torch.equal(matrix.detach(), torch.ones(3, 4))


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-1.0), "learning rate"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(momentum=1.0), "momentum"),
    (dict(ns_steps=2.5), "ns_steps"),
    (dict(ns_steps=-1), "ns_steps"),
])
def test_invalid_hyperparameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cstorch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_traced_muon_matches_eager():
    cstorch.backend("CPU")
    g = torch.Generator().manual_seed(3)
    w_init, v_init = torch.randn(5, 3, generator=g), torch.randn(3, 6, generator=g)
    xs = [torch.randn(4, 5, generator=g) for _ in range(4)]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w_init.clone())
            self.v = torch.nn.Parameter(v_init.clone())

        def forward(self, x):
            return torch.tanh(x @ self.w) @ self.v

    eager = Net()
    eager_opt = cstorch.optim.Muon(eager.parameters(), lr=0.05)
    for x in xs:
        eager_opt.zero_grad()
        eager(x).square().mean().backward()
        eager_opt.step()

    model = Net()
    compiled = cstorch.compile(model)
    opt = cstorch.optim.Muon(model.parameters(), lr=0.05)

    @cstorch.trace
    def step(x):
        opt.zero_grad()
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    for x in xs:
        step(x)
    assert step.captures == 1
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-4, atol=1e-6)
