"""Adam, AdamW and SGD update a whole param group with `torch._foreach_*` ops: the traced
step's optimizer part does not grow with the number of parameters, and the results are
bit for bit those of the per-parameter rule."""
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.optim import _update as U

aten = torch.ops.aten


def _model(layers, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(layers)])


def _graph_nodes(layers, make_optimizer, with_update):
    """Non-getitem ops of the captured graph of one training step."""
    model = _model(layers)
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = make_optimizer(model.parameters())

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if with_update:
            optimizer.step()
        return loss

    float(step(torch.randn(3, 6)))
    (program,) = [p for ps in step.programs.values() for p in (ps if isinstance(ps, list) else [ps])]
    return [n.target for n in program.graph.graph.nodes
            if n.op == "call_function" and n.target.__name__ != "getitem"]


@pytest.mark.parametrize("make_optimizer", [
    lambda ps: cstorch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: cstorch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
], ids=["AdamW", "SGD"])
def test_the_update_is_the_same_few_nodes_for_any_number_of_parameters(make_optimizer):
    # (each of its two kinds of alike parameters, weights and biases, is traced once and
    # widened to all of its members: `bridge.copied_updates`)
    update_ops = {}
    for layers in (4, 8):
        with_update = _graph_nodes(layers, make_optimizer, True)
        without = _graph_nodes(layers, make_optimizer, False)
        update_ops[layers] = len(with_update) - len(without)
        assert any(str(t).startswith("aten._foreach_") for t in with_update)
    assert update_ops[4] == update_ops[8] > 0


def _adamw_reference(params, grads, states, lr, betas, eps, weight_decay):
    """The AdamW rule one parameter at a time, as cstorch wrote it before grouping (the
    powers hold beta^t of the coming step, as the real package keeps them)."""
    b1, b2 = betas
    for p, g, s in zip(params, grads, states):
        s["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        s["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = s["exp_avg_sq"].sqrt().add_(eps)
        step_size = torch.sqrt(1 - s["beta2_power"]) / (1 - s["beta1_power"]) * lr
        s["beta1_power"].mul_(b1)
        s["beta2_power"].mul_(b2)
        p.mul_(1 - lr * weight_decay)
        p.sub_(s["exp_avg"] / denom * step_size)


def _sgd_reference(params, grads, bufs, lr, momentum, dampening):
    for p, g, buf in zip(params, grads, bufs):
        buf.mul_(momentum).add_(g, alpha=1 - dampening)
        p.add_(buf, alpha=-lr)


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def test_adamw_grouped_equals_the_per_parameter_rule_bit_for_bit():
    model = _model(3)
    reference = [p.detach().clone() for p in model.parameters()]
    states = [{"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
               "beta1_power": torch.tensor(0.8), "beta2_power": torch.tensor(0.95)}
              for p in reference]
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=3e-2, betas=(0.8, 0.95), eps=1e-6,
                                    weight_decay=0.1)
    for step in range(4):
        grads = _grads(model, step)
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        optimizer.step()
        _adamw_reference(reference, grads, states, 3e-2, (0.8, 0.95), 1e-6, 0.1)
    for ours, theirs in zip(model.parameters(), reference):
        assert torch.equal(ours.detach(), theirs)
    for p, s in zip(model.parameters(), states):
        for key, value in s.items():
            assert torch.equal(optimizer.state[p][key], value), key


def test_sgd_grouped_equals_the_per_parameter_rule_bit_for_bit():
    model = _model(3)
    reference = [p.detach().clone() for p in model.parameters()]
    bufs = [torch.zeros_like(p) for p in reference]
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.2)
    for step in range(4):
        grads = _grads(model, step)
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        optimizer.step()
        _sgd_reference(reference, grads, bufs, 0.1, 0.9, 0.2)
    for ours, theirs in zip(model.parameters(), reference):
        assert torch.equal(ours.detach(), theirs)


def test_a_rule_with_neither_update_form_says_so():
    class NoRule(U.ElementwiseOptimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def init_state(self, p, group):
            return {}

    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    with pytest.raises(NotImplementedError, match="neither update"):
        NoRule([p]).step()
