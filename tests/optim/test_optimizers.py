"""Every optimizer of the fixture reproduces the real package's trajectory, eagerly and
inside one traced step captured once."""
import pytest
import torch

import cerebras.pytorch as cstorch
from tests.optim.common import (OPT_CLASS, OPTIMIZERS, RTOL, Linear, loss_fn, problem, rel_err,
                                traced_step)


def _check(entry, step_index, w, b, loss):
    ref = OPTIMIZERS[entry]["trajectory"][step_index]
    # Each recorded point is the loss before the step and the parameters after it.
    return max(rel_err(loss, ref["loss"]), rel_err(w, ref["w"]), rel_err(b, ref["b"]))


@pytest.mark.parametrize("entry", list(OPTIMIZERS))
def test_eager_trajectory_and_state_keys(entry):
    cstorch.backend("CPU")
    w, b, data = problem()
    w.requires_grad_()
    b.requires_grad_()
    opt = getattr(cstorch.optim, OPT_CLASS[entry])([w, b], **OPTIMIZERS[entry]["kwargs"])
    sd = opt.state_dict()
    assert {str(k): sorted(v) for k, v in sd["state"].items()} == OPTIMIZERS[entry]["state_keys"]
    assert sorted(sd["param_groups"][0]) == OPTIMIZERS[entry]["param_group_keys"]
    worst = 0.0
    for i, (x, y) in enumerate(data):
        loss = loss_fn(w, b, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        worst = max(worst, _check(entry, i, w.detach(), b.detach(), loss.detach()))
    assert worst < RTOL, worst


@pytest.mark.parametrize("entry", list(OPTIMIZERS))
def test_traced_trajectory(entry):
    cstorch.backend("CPU")
    w, b, data = problem()
    model = Linear(w, b)
    compiled = cstorch.compile(model)
    opt = getattr(cstorch.optim, OPT_CLASS[entry])(model.parameters(), **OPTIMIZERS[entry]["kwargs"])

    step = traced_step(compiled, opt)

    worst = 0.0
    for i, (x, y) in enumerate(data):
        loss = step(x, y)
        worst = max(worst, _check(entry, i, model.w.detach(), model.b.detach(), loss))
    assert step.captures == 1
    assert worst < RTOL, worst
    sd = opt.state_dict()
    assert {str(k): sorted(v) for k, v in sd["state"].items()} == OPTIMIZERS[entry]["state_keys"]


def test_torch_optimizer_in_traced_step_names_the_cstorch_class():
    cstorch.backend("CPU")
    w, b, data = problem()
    model = Linear(w, b)
    compiled = cstorch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    @cstorch.trace
    def step(x, y, optimizer):
        optimizer.zero_grad()
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss

    with pytest.raises(TypeError, match=r"cstorch\.optim\.AdamW"):
        step(*data[0], opt)


@pytest.mark.parametrize("cls", [torch.optim.SGD, torch.optim.Adam])
def test_torch_optimizer_reached_through_a_closure_is_refused_too(cls):
    cstorch.backend("CPU")
    w, b, data = problem()
    model = Linear(w, b)
    compiled = cstorch.compile(model)
    opt = cls(model.parameters(), lr=0.01)

    step = traced_step(compiled, opt)

    with pytest.raises(TypeError, match=rf"cstorch\.optim\.{cls.__name__}"):
        step(*data[0])
    assert all(p.grad is None for p in model.parameters())  # nothing leaked into the module


def test_a_users_own_optimizer_with_a_global_step_runs_under_trace():
    class SignDescent(cstorch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, dict(lr=lr), enable_global_step=True)

        def preinitialize(self):
            pass

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    step = self.increment_global_step(p)
                    p.sub_(p.grad.sign() * group["lr"] / step)

    cstorch.backend("CPU")
    w, b, data = problem()
    model = Linear(w, b)
    compiled = cstorch.compile(model)
    opt = SignDescent(model.parameters(), lr=0.1)

    train = traced_step(compiled, opt)

    before = model.w.detach().clone()
    for x, y in data[:3]:
        train(x, y)
    assert train.captures == 1
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == [3.0, 3.0]
    assert list(opt.state_dict()["state"][0]) == ["step"]
    moved = (model.w - before).abs()
    assert torch.all(moved <= 0.1 * (1 + 1 / 2 + 1 / 3) + 1e-6) and moved.max() > 0.1
    with pytest.raises(RuntimeError, match="enable_global_step"):
        p = torch.nn.Parameter(torch.zeros(1))
        cstorch.optim.SGD([p], lr=0.1).increment_global_step(p)
