"""cstorch.amp.GradScaler inside traced steps against torch.amp.GradScaler run eagerly."""
import copy
import math

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch

STEPS = 7
INF_STEP = 2          # the loss is multiplied by inf at this step: its gradients overflow


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(3)
    for i in range(STEPS):
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        yield x, y, torch.tensor(math.inf if i == INF_STEP else 1.0)


def torch_run(model, half):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # The reference doubles once the steps since the last rescale exceed
    # steps_per_increase (2): torch doubles after growth_interval good steps, so 3.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    losses, scales, params = [], [], []
    for x, y, k in batches():
        with torch.autocast("cpu", dtype=half):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean() * k
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, scales, params


def cstorch_run(model, half, helper):
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=2.0 ** 10,
                                    steps_per_increase=2, max_loss_scale=2.0 ** 20)

    @cstorch.trace
    def step(x, y, k):
        with cstorch.amp.autocast(dtype=half):
            out = compiled(x)
        loss = ((out.float() - y) ** 2).mean() * k
        if helper:
            cstorch.amp.optimizer_step(loss, optimizer, scaler)
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
        return loss, scaler.get_scale()

    losses, scales, params = [], [], []
    for x, y, k in batches():
        loss, scale = step(x, y, k)
        losses.append(float(loss))
        scales.append(float(scale))
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, scales, params, step


@pytest.mark.parametrize("helper", [False, True], ids=["explicit", "optimizer_step"])
def test_float16_run_skips_the_overflowing_step_and_lowers_the_scale(helper):
    model = make()
    reference = copy.deepcopy(model)
    want_losses, want_scales, want_params = torch_run(reference, torch.float16)
    losses, scales, params, step = cstorch_run(model, torch.float16, helper)
    assert step.captures == 1
    # The scale: 2**10, grows after 3 good steps, halves at the overflow, as torch's does.
    assert scales == want_scales
    assert scales[INF_STEP] == scales[INF_STEP - 1] / 2
    # The overflowing step left every parameter exactly as it was.
    for a, b in zip(params[INF_STEP], params[INF_STEP - 1]):
        assert torch.equal(a, b)
    assert not math.isfinite(losses[INF_STEP])
    finite = [i for i in range(STEPS) if i != INF_STEP]
    # float16 matmuls: XLA's and torch's CPU kernels round differently
    np.testing.assert_allclose([losses[i] for i in finite], [want_losses[i] for i in finite],
                               rtol=2e-3)
    for i in finite:
        for a, b in zip(params[i], want_params[i]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-3, atol=2e-4)


def test_float32_dynamic_scaling_equals_torch_within_1e5():
    model = make()
    reference = copy.deepcopy(model)
    want_losses, want_scales, want_params = _float32(reference, torch_run)
    losses, scales, params, _ = _float32(model, lambda m, h: cstorch_run(m, h, False))
    assert scales == want_scales
    finite = [i for i in range(STEPS) if i != INF_STEP]
    np.testing.assert_allclose([losses[i] for i in finite], [want_losses[i] for i in finite],
                               rtol=1e-5)
    for a, b in zip(params[-1], want_params[-1]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def _float32(model, run):
    """The run with autocast switched off (torch.autocast enabled=False via float32)."""
    original = torch.autocast

    class _Off(original):
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            super().__init__(device_type, dtype=torch.bfloat16, enabled=False)

    torch.autocast = _Off
    try:
        return run(model, torch.float16)
    finally:
        torch.autocast = original


def test_scale_is_clamped_and_state_is_checkpointed():
    cstorch.backend("CPU")
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=8.0, min_loss_scale=4.0,
                                    max_loss_scale=16.0, steps_per_increase=1)
    assert float(scaler.get_scale()) == 8.0
    assert scaler.state_dict() == {}   # a fresh scaler's state is its arguments
    scaler.update()          # a good step, 1 since the last rescale: 8
    scaler.update()          # 2 > steps_per_increase: 16
    assert float(scaler.get_scale()) == 16.0
    scaler.update()
    scaler.update()          # 32, clamped to 16 (the upper clamp is not "non-clamped")
    assert float(scaler.get_scale()) == 16.0
    assert float(scaler.get_non_clamped_scale()) == 16.0
    scaler.update(new_scale=2.0)   # below min_loss_scale: raised to it
    assert float(scaler.get_scale()) == 4.0
    assert float(scaler.get_non_clamped_scale()) == 2.0
    scaler.update(new_scale=16.0)
    saved = {k: v.clone() for k, v in scaler.state_dict().items()}
    other = cstorch.amp.GradScaler(loss_scale="dynamic")
    other.load_state_dict(saved)
    assert float(other.get_scale()) == 16.0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"loss_scale": "static"}, ValueError, "loss_scale must be \"dynamic\""),
    ({"loss_scale": -1.0}, ValueError, "loss_scale must be"),
    ({"loss_scale": "dynamic", "steps_per_increase": 0}, ValueError, "steps_per_increase"),
    ({"loss_scale": "dynamic", "min_loss_scale": 8.0, "max_loss_scale": 2.0}, ValueError,
     "min_loss_scale 8.0 is above max_loss_scale 2.0"),
    ({"loss_scale": "dynamic", "overflow_tolerance": -0.5}, ValueError,
     "loss scaling counter threshold must be set >= 0"),
    ({"loss_scale": "dynamic", "min_loss_scale": 2.0 ** -15}, ValueError,
     "min_loss_scale too small"),
    ({"loss_scale": "dynamic", "max_gradient_norm": 0.0}, ValueError, "max_gradient_norm"),
])
def test_bad_arguments(kwargs, error, match):
    cstorch.backend("CPU")
    with pytest.raises(error, match=match):
        cstorch.amp.GradScaler(**kwargs)


def test_static_scale_ignores_dynamic_settings_with_a_warning():
    cstorch.backend("CPU")
    with pytest.warns(UserWarning, match="init_scale only apply to loss_scale=\"dynamic\""):
        scaler = cstorch.amp.GradScaler(loss_scale=128.0, init_scale=4.0)
    assert float(scaler.get_scale()) == 128.0


def test_unscale_twice_is_refused():
    model = make()
    cstorch.compile(model, cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(optimizer)


def test_optimizer_step_refuses_two_clippings():
    cstorch.backend("CPU")
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    optimizer = cstorch.optim.SGD(make().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="by norm or by value, not both"):
        cstorch.amp.optimizer_step(torch.tensor(1.0), optimizer, scaler, max_gradient_norm=1.0,
                                   max_gradient_value=1.0)


def test_static_scaler_refuses_dynamic_state():
    cstorch.backend("CPU")
    scaler = cstorch.amp.GradScaler(loss_scale=8.0)
    with pytest.raises(ValueError, match="constant scale"):
        scaler.update(new_scale=4.0)
    with pytest.raises(ValueError, match="constant scale"):
        scaler.load_state_dict({"scale": 4.0})
    with pytest.raises(TypeError, match="expects a dict"):
        scaler.load_state_dict([1.0])
    with pytest.raises(TypeError, match="the loss as a tensor"):
        scaler.scale(1.0)
    with pytest.warns(UserWarning, match="overflow_tolerance only apply"):
        cstorch.amp.GradScaler(loss_scale=8.0, overflow_tolerance=0.5)


@pytest.mark.parametrize("how", ["scaler_norm", "step_norm", "step_value"])
def test_clipping_in_a_traced_step_equals_torch(how):
    """max_gradient_norm of the scaler or of optimizer_step, or max_gradient_value, clip the
    unscaled gradients as torch.nn.utils.clip_grad_*_ does."""
    model = make()
    reference = copy.deepcopy(model)
    torch_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g) * 10)
            for _ in range(3)]
    for x, y in data:
        torch.nn.functional.mse_loss(reference(x), y).backward()
        if how == "step_value":
            torch.nn.utils.clip_grad_value_(reference.parameters(), 0.05)
        else:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        torch_opt.step()
        torch_opt.zero_grad()

    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=2.0 ** 8,
                                    max_gradient_norm=0.5 if how == "scaler_norm" else None)
    kwargs = {"step_norm": {"max_gradient_norm": 0.5},
              "step_value": {"max_gradient_value": 0.05}}.get(how, {})

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler, **kwargs)
        opt.zero_grad()
        return loss

    for x, y in data:
        step(x, y)
    for a, b in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4,
                                   atol=1e-6)


def test_state_dict_fills_the_destination():
    cstorch.backend("CPU")
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=64.0)
    scaler.update()
    destination = {"kept": 1}
    assert scaler.state_dict(destination=destination) is destination
    assert destination["kept"] == 1 and float(destination["scale"]) == 64.0
    assert cstorch.amp.GradScaler(loss_scale=8.0).state_dict() == {}
