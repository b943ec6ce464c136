"""The hooks a traced step runs: module forward and backward hooks, parameter gradient
hooks and optimizer step hooks, registered before the capture or after it
(`cstorch.tracing.hooks`). Every case trains against eager PyTorch from the same random
weights and compares the weights."""
import copy

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from tests.models import rel_err, sgd_pair


def _pair(seed=0):
    torch.manual_seed(seed)
    eager = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    ours = copy.deepcopy(eager)
    cstorch.backend("CPU")
    step, eager_step, optimizer, reference = sgd_pair(eager, ours)
    return (eager, reference), (ours, optimizer), step, eager_step


def _batch(i):
    g = torch.Generator().manual_seed(200 + i)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _train(step, eager_step, steps):
    for i in steps:
        assert rel_err(float(step(*_batch(i))), eager_step(*_batch(i))) < 1e-5


def _weights_err(eager, ours):
    return max(rel_err(p, q) for p, q in zip(ours.parameters(), eager.parameters()))


def _scale_output(module, args, output):
    return output * 3.0


def _shift_input(module, args):
    return (args[0] + 0.5,)


def _halve_grad_input(module, grad_input, grad_output):
    return tuple(None if g is None else g * 0.5 for g in grad_input)


def _double_grad_output(module, grad_output):
    return tuple(None if g is None else g * 2.0 for g in grad_output)


def _quarter_grad(param):
    param.grad.mul_(0.25)


def _shrink_grads(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.mul_(0.1)


HOOKS = {
    "forward": lambda m, p, o: m[0].register_forward_hook(_scale_output),
    "forward-pre": lambda m, p, o: m[2].register_forward_pre_hook(_shift_input),
    "full-backward": lambda m, p, o: m[2].register_full_backward_hook(_halve_grad_input),
    "full-backward-pre": lambda m, p, o: m[0].register_full_backward_pre_hook(
        _double_grad_output),
    "parameter-gradient": lambda m, p, o: p(m)[0].register_hook(lambda g: g * -2.0),
    "post-accumulate": lambda m, p, o: p(m)[2].register_post_accumulate_grad_hook(
        _quarter_grad),
    "optimizer-step-pre": lambda m, p, o: o.register_step_pre_hook(_shrink_grads),
}


def _params(m):
    return list(m.parameters())


@pytest.mark.parametrize("kind", list(HOOKS))
def test_a_hook_registered_before_the_first_step_runs_in_it(kind):
    (eager, reference), (ours, optimizer), step, eager_step = _pair()
    HOOKS[kind](eager, _params, reference)
    HOOKS[kind](ours, _params, optimizer)
    _train(step, eager_step, range(3))
    assert _weights_err(eager, ours) < 1e-4
    assert step.captures == 1


@pytest.mark.parametrize("kind", list(HOOKS))
def test_a_hook_registered_after_the_capture_captures_again(kind):
    (eager, reference), (ours, optimizer), step, eager_step = _pair(1)
    _train(step, eager_step, range(2))
    handles = [HOOKS[kind](eager, _params, reference), HOOKS[kind](ours, _params, optimizer)]
    _train(step, eager_step, range(2, 4))
    assert step.captures == 2
    assert "hook" in step.recaptures[0][0]
    for h in handles:
        h.remove()   # back to the hooks of the first capture: its program again
    _train(step, eager_step, range(4, 6))
    assert step.captures == 2
    assert _weights_err(eager, ours) < 1e-4


def test_a_global_module_hook_registered_after_the_capture_captures_again():
    (eager, _), (ours, _), step, eager_step = _pair(2)
    _train(step, eager_step, range(2))
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, args, out: out * 2.0 if isinstance(m, nn.Tanh) else None)
    try:
        _train(step, eager_step, range(2, 4))
    finally:
        handle.remove()
    _train(step, eager_step, range(4, 6))
    assert step.captures == 2
    assert _weights_err(eager, ours) < 1e-4


def test_hooks_elsewhere_and_gradients_read_between_steps_capture_nothing():
    (eager, _), (ours, _), step, eager_step = _pair(3)
    other = nn.Linear(2, 2)
    for i in range(4):
        step(*_batch(i))
        eager_step(*_batch(i))
        other.register_forward_hook(_scale_output).remove()
        assert rel_err(ours[0].weight.grad, eager[0].weight.grad) < 1e-4
    assert step.captures == 1
    assert _weights_err(eager, ours) < 1e-4


def _pair_hooked_before_compile(kind, seed):
    """As `_pair`, with the hook of `kind` registered on both models before `ours` is
    compiled (and, for the optimizer hook, before the step's optimizer exists)."""
    torch.manual_seed(seed)
    eager = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    ours = copy.deepcopy(eager)
    handles = []
    if kind != "optimizer-step-pre":
        handles = [HOOKS[kind](eager, _params, None), HOOKS[kind](ours, _params, None)]
    cstorch.backend("CPU")
    step, eager_step, optimizer, reference = sgd_pair(eager, ours)
    if kind == "optimizer-step-pre":
        handles = [HOOKS[kind](eager, _params, reference),
                   HOOKS[kind](ours, _params, optimizer)]
    return (eager, ours), step, eager_step, handles


@pytest.mark.parametrize("kind", list(HOOKS))
def test_a_hook_registered_before_compile_runs_and_its_handle_removes_it(kind):
    (eager, ours), step, eager_step, handles = _pair_hooked_before_compile(kind, 4)
    _train(step, eager_step, range(3))
    assert _weights_err(eager, ours) < 1e-4
    for h in handles:
        h.remove()   # the handle taken before compile still reaches the compiled model
    _train(step, eager_step, range(3, 6))
    assert step.captures == 2
    assert _weights_err(eager, ours) < 1e-4


def test_a_gradient_hook_registered_before_compile_changes_the_training():
    """The hook zeroes the first weight's gradient: eager leaves that weight where it was."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    start = model[0].weight.detach().clone()
    model[0].weight.register_hook(torch.zeros_like)
    calls = []
    model[2].weight.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    cstorch.backend("CPU")
    step, _, _, _ = sgd_pair(copy.deepcopy(model), model)
    for i in range(3):
        step(*_batch(i))
    assert torch.equal(model[0].weight.detach(), start)
    assert not torch.equal(model[2].weight.detach(), model[2].weight.detach() * 0)
    assert len(calls) == 1   # a hook's Python side runs once, when the step is captured


def test_state_dict_hooks_registered_before_compile_still_run():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(3, 2))
    seen = []
    model.register_state_dict_pre_hook(lambda m, prefix, keep_vars: seen.append("pre"))
    handle = model._register_state_dict_hook(
        lambda m, sd, prefix, meta: sd.__setitem__("extra", torch.ones(1)))
    model.register_load_state_dict_post_hook(lambda m, keys: seen.append("load-post"))
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    sd = compiled.state_dict()
    assert "extra" in sd and seen == ["pre"]
    handle.remove()
    assert "extra" not in compiled.state_dict()
    compiled.load_state_dict({k: v * 2 for k, v in compiled.state_dict().items()})
    assert seen == ["pre", "pre", "pre", "load-post"]
    after = model._register_state_dict_hook(   # registered after compile, then removed
        lambda m, sd, prefix, meta: sd.__setitem__("late", torch.zeros(1)))
    assert "late" in compiled.state_dict()
    after.remove()
    assert "late" not in compiled.state_dict()


def test_a_hook_on_a_tensor_made_in_the_step_acts_as_in_eager():
    torch.manual_seed(7)
    eager = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    ours = copy.deepcopy(eager)
    cstorch.backend("CPU")
    cstorch.compile(ours)   # the module itself is called, as Model Zoo's models are
    optimizer = cstorch.optim.SGD(ours.parameters(), lr=0.1)
    reference = torch.optim.SGD(eager.parameters(), lr=0.1)

    def loss_of(model, x, y):
        hidden = model[1](model[0](x))
        hidden.register_hook(lambda g: g * torch.linspace(-1.0, 2.0, 8))
        return ((model[2](hidden) - y) ** 2).mean()

    @cstorch.trace
    def step(x, y):
        loss = loss_of(ours, x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for i in range(3):
        x, y = _batch(i)
        loss = step(x, y)
        want = loss_of(eager, x, y)
        reference.zero_grad()
        want.backward()
        reference.step()
        assert rel_err(float(loss), float(want)) < 1e-5
    assert _weights_err(eager, ours) < 1e-4
