"""An optimizer's update of alike parameters is traced once per kind and copied for the
others (`bridge.copied_updates`): the same values, bit for bit, as tracing every update,
fewer tensors traced, and every case copies cannot reproduce traced one by one."""
import logging

import pytest
import torch
from torch import nn

import bridge
import cerebras.pytorch as cstorch
from bridge import copied_updates
from cstorch.backends import csx


def _model(bias=True):
    torch.manual_seed(0)
    # four alike weights and four alike biases (`copied_updates.MIN_MEMBERS`), and a head
    # of its own shapes
    alike = [m for _ in range(4) for m in (nn.Linear(6, 6, bias=bias), nn.Tanh())]
    return nn.Sequential(*alike, nn.Linear(6, 4, bias=bias))


def _train(make_optimizer, once, bias=True, steps=2):
    """Losses and every state tensor after `steps` traced steps."""
    before = csx.performance.trace_blocks_once
    csx.performance.trace_blocks_once = once
    try:
        model = _model(bias)
        cstorch.backend("CPU")
        compiled = cstorch.compile(model)
        optimizer = make_optimizer(model.parameters())

        @cstorch.trace
        def step(x):
            loss = compiled(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss

        g = torch.Generator().manual_seed(1)
        losses = [float(step(torch.randn(5, 6, generator=g))) for _ in range(steps)]
    finally:
        csx.performance.trace_blocks_once = before
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i, per_param in optimizer.state_dict()["state"].items():
        state.update({f"opt.{i}.{k}": torch.as_tensor(v).clone() for k, v in per_param.items()})
    return losses, state


OPTIMIZERS = {
    "AdamW": lambda ps: cstorch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "SGD": lambda ps: cstorch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "Adafactor": lambda ps: cstorch.optim.Adafactor(ps, lr=1e-2),
    "Lamb": lambda ps: cstorch.optim.Lamb(ps, lr=1e-2, weight_decay=0.1),
    "ASGD": lambda ps: cstorch.optim.ASGD(ps, lr=1e-2),
    "Rprop": lambda ps: cstorch.optim.Rprop(ps, lr=1e-2),
    "Muon": lambda ps: cstorch.optim.Muon(ps, lr=1e-2),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_copies_give_every_parameter_the_values_tracing_it_gives(name, monkeypatch):
    traced = []
    once = copied_updates.Session._once

    def counted(self, update, alike):
        traced.append(len(alike))
        return once(self, update, alike)

    monkeypatch.setattr(copied_updates.Session, "_once", counted)
    bias = name != "Muon"   # Muon takes matrices only
    losses, state = _train(OPTIMIZERS[name], once=True, bias=bias)
    assert traced and max(traced) == 4, traced   # the four alike weights were copied
    del traced[:]
    reference_losses, reference = _train(OPTIMIZERS[name], once=False, bias=bias)
    assert not traced
    assert losses == reference_losses
    assert state.keys() == reference.keys() and len(state) >= 8
    for key, value in reference.items():
        assert torch.equal(state[key], value), key
    initial = _model(bias).state_dict()
    assert all(not torch.equal(state[k], v) for k, v in initial.items())   # all trained


def _rule_calls(monkeypatch) -> list:
    """The number of parameters of each call of AdamW's rule, from now on."""
    seen = []
    rule = cstorch.optim.AdamW.update_group

    def spy(self, params, grads, group, states):
        seen.append(len(params))
        return rule(self, params, grads, group, states)

    monkeypatch.setattr(cstorch.optim.AdamW, "update_group", spy)
    return seen


def test_each_kind_is_traced_for_one_member(monkeypatch):
    """AdamW's rule runs on one weight and one bias of the four alike layers, and on the
    head's two parameters together, instead of on all ten."""
    seen = _rule_calls(monkeypatch)
    _train(OPTIMIZERS["AdamW"], once=True, steps=1)
    assert sorted(seen) == [1, 1, 2]
    del seen[:]
    _train(OPTIMIZERS["AdamW"], once=False, steps=1)
    assert seen == [10]


class AddsState(cstorch.optim.SGD):
    """Keeps each parameter's last update as state of its own, made in the step."""

    def update_group(self, params, grads, group, states):
        before = [p.detach().clone() for p in params]
        super().update_group(params, grads, group, states)
        for p, b, state in zip(params, before, states):
            state["last_update"] = p.detach() - b


class Noisy(cstorch.optim.SGD):
    def update_group(self, params, grads, group, states):
        super().update_group(params, grads, group, states)
        for p in params:
            p.add_(torch.rand_like(p) * 1e-3)


@pytest.mark.parametrize("make, why", [
    (lambda ps: AddsState(ps, lr=0.1, momentum=0.9), "adds or removes state"),
    (lambda ps: Noisy(ps, lr=0.1), "draws random numbers"),
], ids=["state", "random"])
def test_updates_that_cannot_be_copied_are_traced_one_by_one(make, why, caplog):
    """Each is traced update by update, says why at INFO, and computes what tracing every
    update computes (copies would lose the new state, or reuse one parameter's random
    draws)."""
    with caplog.at_level(logging.INFO, logger="cstorch"):
        outcome = _caught(lambda: _train(make, once=True))
    said = [r.getMessage() for r in caplog.records
            if "alike parameters' updates are traced one by one" in r.getMessage()]
    assert said and why in said[0], said
    reference = _caught(lambda: _train(make, once=False))
    if isinstance(reference, Exception):   # the step's own refusal, raised either way
        assert type(outcome) is type(reference) and str(outcome) == str(reference)
        return
    (losses, state), (ref_losses, ref_state) = outcome, reference
    assert losses == ref_losses
    for key, value in ref_state.items():
        assert torch.equal(state[key], value), key


def _caught(run):
    try:
        return run()
    except Exception as e:   # compared between the two captures
        return e


def test_an_update_of_few_alike_parameters_is_traced_as_before(monkeypatch):
    """Parameters of distinct shapes, and kinds of fewer than `MIN_MEMBERS`, are updated
    together by one run of the rule, as without copies."""
    seen = _rule_calls(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 5), nn.Linear(5, 2))
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2)

    @cstorch.trace
    def step(x):
        loss = compiled(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step(torch.randn(2, 3))
    assert seen == [6]


def _capture_members(each):
    """Four alike 3-vectors, each updated by ``each(t, shared, kept)`` under a session,
    beside a shared 0-d tensor; `kept` is a list the step returns too."""
    inputs = [torch.zeros(3)] * 4 + [torch.zeros(())]
    kept = []

    def update(batch):
        for _, (t,) in batch:
            each(t, shared[0], kept)
        return [ts for _, ts in batch]

    def step(a, b, c, d, s):
        shared[:] = [s]
        session.apply(update, [((), [x]) for x in (a, b, c, d)], shared=[s])
        return [a, b, c, d, s] + kept

    shared = []
    with copied_updates.copies() as session:
        return bridge.capture(step, inputs, graph_pass=session.expand)


def test_a_write_into_a_shared_tensor_cannot_be_copied():
    """Each copy would add 1 once per kind, not once per member."""
    def each(t, shared, kept):
        t.mul_(2)
        shared.add_(1)

    with pytest.raises(copied_updates.NotCopied, match="writes into a tensor its members share"):
        _capture_members(each)


def test_a_value_read_outside_the_update_cannot_be_copied():
    def each(t, shared, kept):
        kept[:] = [t * 3]
        t.add_(kept[0])

    with pytest.raises(copied_updates.NotCopied, match="read outside it"):
        _capture_members(each)


def test_copied_members_compute_the_traced_members_ops():
    """The graph gives each member what running the update on it gives."""
    def each(t, shared, kept):
        t.mul_(shared + 2).add_(1)

    graph = _capture_members(each)
    assert not [n for n in graph.graph.nodes if "bridge_updates" in str(n.target)]
    *xs, s = [torch.randn(3) for _ in range(4)] + [torch.randn(())]
    got = graph(*[x.clone() for x in xs], s.clone())
    for x, y in zip(got[:4], xs):
        assert torch.equal(x, y * (s + 2) + 1)
    assert torch.equal(got[4], s)


def test_copied_updates_train_as_eager_pytorch():
    """SGD with Nesterov momentum over four alike layers, copies on, against torch.optim's
    SGD run eagerly on a copy of the model: the same losses and parameters."""
    losses, state = _train(OPTIMIZERS["SGD"], once=True)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    g = torch.Generator().manual_seed(1)
    eager = []
    for _ in range(2):
        loss = model(torch.randn(5, 6, generator=g)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        eager.append(loss.item())
    assert losses == pytest.approx(eager, rel=1e-5)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6)
