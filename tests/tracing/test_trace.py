"""One capture and one compilation per step signature; the JAX function of a step; the
errors a traced step raises."""
import warnings

import jax
import jax.monitoring
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from tests.models import rel_err


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, optimizer, step


def _batch(i, n=8):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_ten_steps_are_one_capture_and_one_xla_compilation(mlp):
    model, optimizer, step = mlp
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for i in range(10):
            step(*_batch(i))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert step.captures == 1
    assert len(compiles) == 1


def test_a_new_batch_shape_is_a_new_capture(mlp):
    _, _, step = mlp
    step(*_batch(0, 8))
    step(*_batch(1, 8))
    step(*_batch(2, 4))
    assert step.captures == 2


def test_jax_function_under_users_jit_equals_the_traced_step(mlp):
    model, optimizer, step = mlp
    step(*_batch(0))
    x, y = _batch(1)
    js = step.to_jax(x, y)
    state, inputs, rng = js.args
    new_state, (loss,) = jax.jit(js.fn)(state, inputs, rng)
    # Copies: the traced step donates its state buffers to XLA.
    before = {k: np.asarray(v).copy() for k, v in new_state.items()}
    traced_loss = step(x, y)
    assert rel_err(np.asarray(loss), traced_loss) < 1e-6
    after = model.state_dict()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name, value in before.items():
        if name.startswith("model.") and name.endswith(".grad"):
            assert rel_err(value, grads[name[len("model."):-len(".grad")]]) < 1e-6, name
        elif name.startswith("model."):
            assert rel_err(value, after[name[len("model."):]]) < 1e-6, name
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert rel_err(before["optimizer.state.0.momentum_buffer"], momentum) < 1e-6


def test_jax_function_composes_with_jax_transformations(mlp):
    _, _, step = mlp
    js = step.to_jax(*_batch(0))
    state, inputs, rng = js.args
    jaxpr = jax.make_jaxpr(js.fn)(state, inputs, rng)
    assert "dot_general" in str(jaxpr)
    assert "stablehlo" in js.stablehlo() or "func.func" in js.stablehlo()

    def loss_of_first_weight(w):
        return js.fn({**state, "model.0.weight": w}, inputs, rng)[1][0]

    grad = jax.grad(loss_of_first_weight)(state["model.0.weight"])
    assert grad.shape == state["model.0.weight"].shape
    assert float(jnp_abs_sum(grad)) > 0


def jnp_abs_sum(a):
    return np.abs(np.asarray(a)).sum()


def test_state_is_visible_through_the_torch_module_after_steps(mlp):
    model, optimizer, step = mlp
    w0 = model[0].weight.detach().clone()
    step(*_batch(0))
    assert not torch.equal(model[0].weight, w0)  # attribute access shows the new value
    assert torch.equal(dict(model.named_parameters())["0.weight"], model[0].weight)
    assert torch.equal(model.state_dict()["0.weight"], model[0].weight)


def test_torch_side_writes_reach_the_next_step(mlp):
    model, optimizer, step = mlp
    step(*_batch(0))
    with torch.no_grad():
        model[2].bias.fill_(5.0)
    step(*_batch(1))
    assert not torch.allclose(model[2].bias, torch.full((3,), 5.0))
    assert (model[2].bias - 5.0).abs().max() < 1.0  # one step away from 5, not from before


@pytest.mark.parametrize("read", [
    lambda t: t.item(), lambda t: print(t), lambda t: bool(t.sum() > 0), lambda t: t.tolist(),
    lambda t: float(t.sum()),
])
def test_reading_a_value_inside_a_traced_step_says_to_use_step_closure(read):
    cstorch.backend("CPU")
    model = nn.Linear(3, 1)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        out = compiled(x)
        read(out)
        return out

    with pytest.raises(RuntimeError, match="step_closure"):
        step(torch.randn(2, 3))
    # Nothing of the failed capture is left behind on the module.
    assert isinstance(model.weight, nn.Parameter)
    assert model(torch.randn(2, 3)).shape == (2, 1)


def test_dropout_draws_a_fresh_mask_each_step_reproducibly():
    def run():
        torch.manual_seed(3)
        cstorch.backend("CPU")
        model = nn.Sequential(nn.Dropout(0.5))
        compiled = cstorch.compile(model)

        @cstorch.trace
        def step(x):
            return compiled(x)

        x = torch.ones(64)
        return [step(x) for _ in range(3)]

    first, second = run(), run()
    assert not torch.equal(first[0], first[1])  # a new mask every step
    for a, b in zip(first, second):              # the same masks from the same seed
        assert torch.equal(a, b)
    kept = first[0][first[0] != 0]
    assert torch.allclose(kept, torch.full_like(kept, 2.0))
    assert 10 < int((first[0] == 0).sum()) < 54


def test_optimizer_state_is_current_after_steps(mlp):
    model, optimizer, step = mlp
    step(*_batch(0))
    buf = optimizer.state[model[0].weight]["momentum_buffer"]
    assert buf.abs().sum() > 0
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], buf)


def test_retrace_every_iteration_captures_each_call():
    cstorch.backend("CSX", retrace_every_iteration=True)
    try:
        compiled = cstorch.compile(nn.Linear(2, 2))

        @cstorch.trace
        def step(x):
            return compiled(x)

        for _ in range(3):
            step(torch.randn(1, 2))
        assert step.captures == 3
    finally:
        cstorch.backends.csx.debug.reset()


def test_compile_only_backend_runs_one_step_by_default():
    cstorch.backend("CSX", compile_only=True)
    loader = cstorch.utils.data.DataLoader(lambda: [torch.zeros(1)] * 5)
    assert len(list(cstorch.utils.data.DataExecutor(loader))) == 1


def test_lazily_created_state_materialises_on_the_device_only():
    cstorch.backend("CPU")

    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.register_buffer("shift", cstorch.full((4,), 0.5))

        def forward(self, x):
            return self.linear(x) + self.shift

    model = Shifted()
    lazy = model.shift
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x)

    x = torch.randn(2, 4)
    out = step(x)
    assert not lazy.is_materialized  # built on the device, never on the host
    with torch.no_grad():
        expected = model.linear(x) + 0.5
    assert torch.allclose(out, expected)


def test_train_eval_switch_is_a_new_program_and_a_new_python_lr_is_an_input(mlp):
    model, optimizer, step = mlp
    step(*_batch(0))
    model.eval()
    step(*_batch(1))
    model.train()
    step(*_batch(2))
    assert step.captures == 2
    for group in optimizer.param_groups:
        group["lr"] = 0.05
    step(*_batch(3))
    assert step.captures == 2   # a changed nonzero lr is an input of the same program
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    w = model[0].weight.detach().clone()
    step(*_batch(4))
    assert step.captures == 3   # a zero lr may change the program's structure
    assert torch.equal(model[0].weight, w)  # lr 0 took effect


def test_steps_copy_no_state_to_the_host_until_it_is_read(mlp):
    model, optimizer, step = mlp
    step(*_batch(0))
    before = model[0].weight.detach().clone()
    with jax.transfer_guard_device_to_host("disallow"):
        for i in range(5):
            step(*_batch(i))
    after = model.state_dict()["0.weight"]  # the read brings the values over
    assert not torch.equal(after, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_writing_an_input_after_the_call_leaves_the_dispatched_step_alone(dtype):
    # A step returns before XLA has run it. Eager semantics: once step(x) has returned, x
    # is the caller's to write. The slow chain runs before x is read, so a program that
    # still read the caller's memory would see the writes below.
    torch.manual_seed(0)
    cstorch.backend("CPU")
    weight = torch.randn(256, 256) / 16

    @cstorch.trace
    def step(x, h):
        for _ in range(40):
            h = torch.tanh(h @ h)
        return x * (h.sum() * 0 + 1)

    x = torch.randn(4096).to(dtype)
    step(x.clone(), weight)   # capture and compile first: the calls below only dispatch
    for i in range(5):
        x = torch.randn(4096, generator=torch.Generator().manual_seed(i)).to(dtype)
        expected = x.clone()
        out = step(x, weight)
        x.fill_(7.0)
        assert torch.equal(out.to(dtype).cpu(), expected), f"call {i}"


def test_a_capture_pauses_the_collector_and_gives_it_back():
    import gc
    cstorch.backend("CPU")
    seen = []

    @cstorch.trace
    def step(x):
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return x * 2

    before = gc.get_freeze_count()
    assert gc.isenabled()
    x = torch.randn(3)
    out = step(x)
    assert seen and seen[0][0] is False   # no collection while the step is captured
    assert seen[0][1] > before   # what existed before is left out of any pass made
    assert gc.isenabled()   # and the collector runs again after
    assert gc.get_freeze_count() == before
    assert torch.equal(out.cpu(), x * 2)

    # A collector the user turned off stays off.
    @cstorch.trace
    def other(x):
        return x + 1

    gc.disable()
    try:
        out = other(x)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert torch.equal(out.cpu(), x + 1)


def _linear():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Linear(6, 3)
    return model, cstorch.compile(model)


def test_a_closed_over_tensor_written_after_the_capture_is_captured_again():
    model, compiled = _linear()
    scale = torch.randn(3, generator=torch.Generator().manual_seed(3))

    @cstorch.trace
    def scaled(x):
        return (compiled(x) * scale).sum()

    def eager(x):
        with torch.no_grad():
            return float((model(x) * scale).sum())

    x, _ = _batch(1)
    for _ in range(2):
        assert rel_err(float(scaled(x)), eager(x)) < 1e-5
    assert scaled.captures == 1
    edits = [lambda: scale.mul_(-3.0),                                  # in place
             lambda: setattr(scale, "data", torch.randn(3) + 5.0)]      # new data
    for i, edit in enumerate(edits):
        edit()
        with pytest.warns(UserWarning, match="closes over.*written in place or given new "
                                             "data.*as an argument"):
            got = float(scaled(x))
        assert rel_err(got, eager(x)) < 1e-5
        assert rel_err(float(scaled(x)), eager(x)) < 1e-5   # and no capture more
        assert scaled.captures == 2 + i
    assert len(scaled.recaptures) == 2


def test_a_closed_over_inference_tensor_is_a_constant():
    model, compiled = _linear()
    with torch.inference_mode():
        table = torch.randn(3, generator=torch.Generator().manual_seed(4))

    @cstorch.trace
    def scaled(x):
        return (compiled(x) * table).sum()

    x, _ = _batch(1)
    with torch.no_grad():
        assert rel_err(float(scaled(x)), float((model(x) * table).sum())) < 1e-5


def test_a_parameter_held_outside_the_step_and_passed_in_a_list_is_the_steps_own_state():
    """torch.stack takes its tensors in a list: the capture finds the parameter the step
    closed over there and trains it, as eager does, instead of baking in its value."""
    import copy
    model, compiled = _linear()
    reference = copy.deepcopy(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    bias, reference_bias = model.bias, reference.bias   # held before the step

    def loss_of(forward, b, x):
        return (torch.stack([forward(x)[0], b]) ** 2).sum()

    @cstorch.trace
    def step(x):
        loss = loss_of(compiled, bias, x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for i in range(3):
        x, _ = _batch(i)
        loss = step(x)
        expected = loss_of(reference, reference_bias, x)
        reference_optimizer.zero_grad()
        expected.backward()
        reference_optimizer.step()
        assert rel_err(float(loss), float(expected)) < 1e-5, f"step {i}"
    torch.testing.assert_close(model.bias.detach().cpu(), reference.bias.detach())
    torch.testing.assert_close(model.weight.detach().cpu(), reference.weight.detach())


def test_a_closed_over_tensor_that_requires_grad_is_refused():
    _, compiled = _linear()
    gate = torch.randn(3, requires_grad=True)

    @cstorch.trace
    def gated(x):
        return (compiled(x) * gate).sum()

    with pytest.raises(RuntimeError, match=r"shape \(3,\) that requires grad but belongs to "
                                           r"no compiled module.*detach.*\n.*\n.*gated"):
        gated(_batch(1)[0])


def test_autocast_and_the_default_dtype_at_the_call_choose_the_program():
    model, compiled = _linear()

    @cstorch.trace
    def forward(x):
        return compiled(x), torch.ones(2)

    x, _ = _batch(1)
    out, ones = forward(x)
    assert out.dtype == torch.float32 and ones.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out, _ = forward(x)
        expected = model(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    assert rel_err(out, expected) < 2e-2
    torch.set_default_dtype(torch.float64)
    try:
        _, ones = forward(x)
    finally:
        torch.set_default_dtype(torch.float32)
    assert ones.dtype == torch.float64
    out, ones = forward(x)   # back to the first program
    assert out.dtype == torch.float32 and ones.dtype == torch.float32
    assert forward.captures == 3
    assert forward.recaptures[0] == [
        "default dtype and CPU autocast dtype: (torch.float32, False) -> "
        "(torch.float32, torch.bfloat16)"]


def test_an_argument_requiring_grad_warns_and_the_in_step_route_matches_eager():
    """A step takes its arguments as values: eager PyTorch would fill `x.grad`, the program
    cannot, so the first such call warns (once). Differentiating with respect to the input
    inside the step, as the warning says, computes what eager PyTorch does."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    eager = nn.Linear(8, 4)
    eager.load_state_dict(model.state_dict())
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)

    @cstorch.trace
    def loss_of(x):
        return compiled(x).square().mean()

    x = torch.randn(4, 8, requires_grad=True)
    with pytest.warns(UserWarning, match=r"position\(s\) \[0\].*require grad.*no gradient "
                                         r"reaches them") as caught:
        loss_of(x)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_of(x)   # once per step
        loss_of(x.detach())
    assert x.grad is None

    @cstorch.trace
    def input_gradient(x):
        x = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(compiled(x).square().mean(), x)
        return g

    y = torch.randn(4, 8)
    y_leaf = y.clone().requires_grad_()
    eager(y_leaf).square().mean().backward()
    assert rel_err(input_gradient(y).to("cpu"), y_leaf.grad) < 1e-5


def test_a_step_closure_sees_its_arguments_as_they_were_when_it_was_called():
    """As in eager code, where the closure would read the value at once: a tensor written
    in place later in the step (a learning rate a scheduler steps after the optimizer's
    hooks logged it) is seen with the value it had at the call."""
    cstorch.backend("CPU")
    model = nn.Linear(3, 1)
    compiled = cstorch.compile(model)
    seen = []

    @cstorch.step_closure
    def log(value, weight):
        seen.append((float(value), weight.detach().clone()))

    @cstorch.trace
    def step(x):
        total = compiled(x).sum()
        before = model.weight.detach().clone()
        log(total, model.weight)
        total.mul_(10.0)
        with torch.no_grad():
            model.weight.add_(1.0)
        return total, before

    x = torch.randn(2, 3)
    for _ in range(2):
        total, before = step(x)
        assert seen[-1][0] == pytest.approx(float(total) / 10.0, rel=1e-6)
        assert torch.equal(seen[-1][1], before)
    assert not torch.equal(model.weight.detach(), before)
